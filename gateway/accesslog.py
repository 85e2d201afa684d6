"""The access log: one JSON line per MCP request, cheap enough to leave on for cache hits.

The proxy logs every MCP request to the ``mcp_gateway.access`` logger. Through the plain
``logging`` machinery (a ``LogRecord``, python-json-logger, a flush per line) a line costs more
than answering a cache hit, so ``mcp-gateway serve --log-format json`` puts an
:class:`AccessLogHandler` on that logger: the proxy hands it the line's fields directly
(:meth:`AccessLogHandler.write`), and lines are written in batches, every 50 ms. Records
that reach the handler through ``logging`` get the same shape. Anyone who configures other
handlers on the logger gets the ordinary ``logging`` path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import sys
import time
from typing import Any, Final, TextIO

import orjson

__all__ = ["ACCESS_LOGGER", "AccessLogHandler", "direct_handler"]

ACCESS_LOGGER: Final = "mcp_gateway.access"

#: Queued lines are written this long after the first of them (seconds) ...
FLUSH_DELAY_S: Final = 0.05
#: ... or at once when this many bytes are queued.
FLUSH_BYTES: Final = 64 * 1024
#: Writes up to this size are atomic on a pipe: lines of several worker processes sharing
#: stderr never interleave.
_ATOMIC_WRITE: Final = getattr(select, "PIPE_BUF", 512)
#: Attributes every ``LogRecord`` has; the others came in through ``extra=``.
_RECORD_ATTRS: Final = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class AccessLogHandler(logging.Handler):
    """JSON access-log lines, ``{"asctime", "level", "name", "message", **fields}``, in batches.

    The keys are those of the gateway's JSON log format (``asctime`` as ``logging`` prints
    it, local time with milliseconds). Lines are queued and written ``FLUSH_DELAY_S`` after
    the first of them, or as soon as ``FLUSH_BYTES`` are queued, in ``write(2)`` calls of
    at most ``PIPE_BUF`` bytes that end on a line boundary; outside an event loop, at once.
    ``flush``/``close`` (and so ``logging.shutdown`` at exit) write what is queued.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stderr
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._scheduled: asyncio.TimerHandle | None = None
        self._second = -1
        self._stamp = ""

    def write(self, fields: dict[str, Any]) -> None:
        """Queue one INFO line of the access logger with ``fields`` (the proxy's fast path)."""
        line = orjson.dumps(
            {
                "asctime": self._asctime(time.time()),
                "level": "INFO",
                "name": ACCESS_LOGGER,
                "message": "request",
                **fields,
            }
        )
        self._queue(line)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}
            line = orjson.dumps(
                {
                    "asctime": self._asctime(record.created),
                    "level": record.levelname,
                    "name": record.name,
                    "message": record.getMessage(),
                    **fields,
                },
                default=str,
            )
        except Exception:
            self.handleError(record)
            return
        self._queue(line)

    def flush(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if not self._pending:
            return
        lines, self._pending, self._pending_bytes = self._pending, [], 0
        lines.append(b"")
        data = b"\n".join(lines)
        # Cut at the last line end within each PIPE_BUF (a longer line goes alone, whole).
        chunks: list[bytes | memoryview] = []
        view, start, size = memoryview(data), 0, len(data)
        while size - start > _ATOMIC_WRITE:
            cut = data.rfind(b"\n", start, start + _ATOMIC_WRITE)
            if cut < 0:
                cut = data.find(b"\n", start + _ATOMIC_WRITE)
            chunks.append(view[start : cut + 1])
            start = cut + 1
        if start < size:
            chunks.append(view[start:])
        try:
            self._write(chunks)
        except Exception:  # a log line is never worth a failed request
            with contextlib.suppress(Exception):
                sys.stderr.write("mcp-gateway: access log write failed\n")

    def close(self) -> None:
        self.flush()
        super().close()

    def _queue(self, line: bytes) -> None:
        self._pending.append(line)
        self._pending_bytes += len(line)
        if self._pending_bytes >= FLUSH_BYTES:
            self.flush()
        elif self._scheduled is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._scheduled = loop.call_later(FLUSH_DELAY_S, self.flush)

    def _write(self, chunks: list[bytes | memoryview]) -> None:
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            for chunk in chunks:
                self.stream.write(bytes(chunk).decode())
            self.stream.flush()
            return
        self.stream.flush()  # whatever other writers left in the stream's buffer goes first
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]

    def _asctime(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._stamp},{int((created - second) * 1000):03d}"


def direct_handler(logger: logging.Logger) -> AccessLogHandler | None:
    """The :class:`AccessLogHandler` that alone receives ``logger``'s INFO records, if any.

    Only then may a caller skip ``logging`` and :meth:`AccessLogHandler.write` directly: no
    other handler, no propagation to other handlers and no filter would see the line.
    """
    handlers = logger.handlers
    if len(handlers) != 1 or logger.propagate or logger.filters:
        return None
    handler = handlers[0]
    if type(handler) is AccessLogHandler and handler.level <= logging.INFO and not handler.filters:
        return handler
    return None
