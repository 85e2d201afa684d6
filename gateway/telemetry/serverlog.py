"""aiohttp's own server errors, logged as one short line each and at a bounded rate.

aiohttp logs a request it cannot parse (bare ``\\n`` line ends, a bad header, a body that does
not decode) at ERROR with a traceback, and the exception's text quotes the raw request: its
headers, ``Authorization`` included. Any caller could fill the log with them. This filter keeps
the gist (aiohttp's message and the exception's class) and nothing of the request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

__all__ = ["SERVER_LOGGER", "ServerErrorFilter", "quiet_server_errors"]

#: aiohttp's logger for its request handler.
SERVER_LOGGER: Final = "aiohttp.server"
#: Lines let through per window, and the window, in seconds.
LINES_PER_WINDOW: Final = 10
WINDOW_S: Final = 10.0


class ServerErrorFilter(logging.Filter):
    """Rewrites ``aiohttp.server`` records: no traceback, no request text, WARNING, and at most
    ``per_window`` of them every ``window_s`` seconds (the next line let through says how many
    were dropped)."""

    def __init__(
        self,
        per_window: int = LINES_PER_WINDOW,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.per_window = per_window
        self.window_s = window_s
        self.clock = clock
        self._window_start = -float("inf")
        self._count = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now - self._window_start >= self.window_s:
            self._window_start, self._count = now, 0
        self._count += 1
        if self._count > self.per_window:
            self._dropped += 1
            return False
        exc = record.exc_info[1] if record.exc_info else None
        # aiohttp's message is fixed text ("Error handling request from %s", "Unhandled
        # exception"); its args and the exception's text may hold the request: none is kept.
        if isinstance(exc, (HttpProcessingError, RequestPayloadError)):
            summary = "refused a request it could not parse"  # "Unhandled exception" is aiohttp's word
        else:
            summary = str(record.msg).replace(" from %s", "").replace("%s", "?")[:80]
        record.msg = "%s (%s)" + (" [%d similar lines dropped]" if self._dropped else "")
        record.args = (summary, type(exc).__name__ if exc is not None else "no exception", self._dropped)[
            : 3 if self._dropped else 2
        ]
        record.exc_info = record.exc_text = record.stack_info = None
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        self._dropped = 0
        return True


def quiet_server_errors(logger: logging.Logger | None = None) -> ServerErrorFilter:
    """Install a :class:`ServerErrorFilter` on aiohttp's server logger (once)."""
    logger = logger if logger is not None else logging.getLogger(SERVER_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, ServerErrorFilter):
            return existing
    installed = ServerErrorFilter()
    logger.addFilter(installed)
    return installed
