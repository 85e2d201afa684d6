"""The access log: one JSON line per MCP request, cheap enough to leave on for cache hits.

Every MCP request is logged to the ``mcp_gateway.access`` logger. Through the plain ``logging``
machinery (a ``LogRecord``, python-json-logger, a flush per line) a line costs more than
answering a cache hit, so ``mcp-gateway serve --log-format json`` puts an
:class:`AccessLogHandler` on that logger alone, and the request journal hands it request records
in batches (:meth:`AccessLogHandler.write_requests`), each batch written in one go. Anyone who
configures other handlers on the logger gets the ordinary ``logging`` path, one record each,
with the same fields (:func:`request_fields`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import stat
import sys
import time
from collections.abc import Sequence
from typing import Any, Final, TextIO

import orjson

from .record import RequestRecord

__all__ = ["ACCESS_LOGGER", "AccessLogHandler", "direct_handler", "request_fields"]

ACCESS_LOGGER: Final = "mcp_gateway.access"

#: Writes up to this size (bytes) are atomic on a pipe: the lines of several worker processes
#: sharing stderr never interleave.
_ATOMIC_WRITE: Final = getattr(select, "PIPE_BUF", 512)
#: Attributes every ``LogRecord`` has; the others came in through ``extra=``.
_RECORD_ATTRS: Final = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def request_fields(record: RequestRecord) -> dict[str, Any]:
    """The access log's fields of a request: ``upstream``, ``method``, ``http_method``,
    ``status``, ``jsonrpc_error``, ``cache``, ``cache_status``, ``subject`` (who called, when
    known: never a token) and ``duration_ms`` (milliseconds, three decimals)."""
    fields: dict[str, Any] = {
        "upstream": record.upstream,
        "method": record.method,
        "http_method": record.http_method,
        "status": record.status,
        "jsonrpc_error": record.jsonrpc_error,
        "cache": record.cache,
        "cache_status": record.cache_status,
    }
    if record.subject is not None:
        fields["subject"] = record.subject
    fields["duration_ms"] = round(record.seconds * 1000, 3)
    return fields


class AccessLogHandler(logging.Handler):
    """JSON access-log lines, ``{"asctime", "level", "name", "message", **fields}``.

    The keys are those of the gateway's JSON log format (``asctime`` as ``logging`` prints it,
    local time with milliseconds). Request lines come in batches from the request journal
    (:meth:`write_requests`), records through ``logging`` one by one (:meth:`emit`); each is
    written when it comes. To a regular file a batch is one ``write(2)``; to anything else (a
    pipe, a socket such as journald's) in writes of at most ``PIPE_BUF`` bytes that end on a
    line boundary, so that the lines of several workers sharing it never interleave.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stderr
        #: The second (``time.time()``, floored) that ``_stamp`` is the text of; none yet.
        self._second = math.nan
        self._stamp = ""
        #: The text of a kind of request's fields (see :meth:`line`), by their values.
        self._kinds: dict[tuple[object, ...], str] = {}

    def write_requests(self, records: Sequence[RequestRecord]) -> None:
        """Write one line per request record (:meth:`line`), in one go, each stamped with the time
        its request ended. A line that cannot be written is dropped (with a note on stderr),
        never the batch."""
        offset = time.time() - time.perf_counter()
        lines = []
        for record in records:
            try:
                lines.append(self.line(record, record.ended + offset))
            except Exception:  # a log line is never worth a failed request
                with contextlib.suppress(Exception):
                    sys.stderr.write("mcp-gateway: access log line dropped\n")
        if lines:
            lines.append("")
            self._write_safely("\n".join(lines).encode())

    def plain_line(self, record: RequestRecord, created: float) -> str:
        """The JSON line of ``record``, ``created`` (``time.time()`` seconds) its stamp."""
        head = {"asctime": self._asctime(created), "level": "INFO", "name": ACCESS_LOGGER, "message": "request"}
        fields = request_fields(record)
        fields["duration_ms"] = orjson.Fragment(_milliseconds(record.seconds))
        return orjson.dumps(head | fields).decode()

    def line(self, record: RequestRecord, created: float) -> str:
        """:meth:`plain_line`, from the remembered text of the fields a request shares with others
        of its kind (upstream, methods, status, error, cache, Cache-Status), the milliseconds of
        the stamp from a table: a line costs a fraction of the plain one, which is several percent
        of a cache hit (bench/RESULTS.md). The same text (tests/telemetry/test_accesslog.py)."""
        # ✂ fast version of plain_line (and of its _asctime and _milliseconds)
        fields = self._kinds.get(record[:7])
        if fields is None:
            fields = self._kind_text(record)
        second = self._second
        if not second <= created < second + 1.0:  # another second (always at first: NaN)
            second = self._new_second(created)
        ms = (created - second) * 1000  # floored as %d floors it, at most 999 as in _asctime
        millis = _MILLIS[int(ms) if ms < 999.0 else 999]
        duration = "%.3f" % (record.seconds * 1000)  # _milliseconds, inlined
        subject = record.subject
        if subject is not None:  # not part of the kind: subjects are many
            fields = f'{fields}"subject":{orjson.dumps(subject).decode()},'
        return f'{{"asctime":"{self._stamp},{millis}",{fields}"duration_ms":{duration}}}'
        # ✂

    def _kind_text(self, record: RequestRecord) -> str:
        """The JSON text between asctime and ``duration_ms`` of ``record``'s kind, remembered (at
        most 4096 kinds: a kind's values come from config and fixed sets, but Cache-Status holds
        a ttl)."""
        text = orjson.dumps(
            {
                "level": "INFO",
                "name": ACCESS_LOGGER,
                "message": "request",
                **request_fields(record._replace(subject=None)),
            }
        )
        fields = text.decode()[1:].rsplit('"duration_ms":', 1)[0]
        if len(self._kinds) >= 4096:
            self._kinds.clear()
        self._kinds[record[:7]] = fields
        return fields

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}
            head = {"asctime": self._asctime(record.created), "level": record.levelname, "name": record.name}
            line = orjson.dumps(head | {"message": record.getMessage(), **fields}, default=str)
        except Exception:
            self.handleError(record)
            return
        self._write_safely(line + b"\n")

    def _write_safely(self, data: bytes) -> None:
        try:
            self._write(data)
        except Exception:  # a log line is never worth a failed request
            with contextlib.suppress(Exception):
                sys.stderr.write("mcp-gateway: access log write failed\n")

    def _write(self, data: bytes) -> None:
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            self.stream.write(data.decode())
            self.stream.flush()
            return
        self.stream.flush()  # whatever other writers left in the stream's buffer goes first
        view = memoryview(data)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            while view:
                view = view[os.write(fd, view) :]
            return
        # A pipe or a socket (journald): writes up to PIPE_BUF are atomic on a pipe and in
        # practice on a local stream socket. Cut at the last line end within each PIPE_BUF (a
        # longer line goes alone, whole).
        start, size = 0, len(data)
        while start < size:
            end = size
            if size - start > _ATOMIC_WRITE:
                end = data.rfind(b"\n", start, start + _ATOMIC_WRITE) + 1 or data.find(b"\n", start + _ATOMIC_WRITE) + 1
            chunk = view[start:end]
            while chunk:
                chunk = chunk[os.write(fd, chunk) :]
            start = end

    def _asctime(self, created: float) -> str:
        """``created`` (``time.time()`` seconds) as ``logging`` writes asctime: local time, then
        milliseconds. The text of the second is kept, as lines come many to a second."""
        second = self._second
        if not second <= created < second + 1.0:  # another second (always at first: NaN)
            second = self._new_second(created)
        # %d truncates (floored milliseconds); a time a hair below a second can round up to 1000.
        return "%s,%03d" % (self._stamp, min(999.0, (created - second) * 1000))  # noqa: UP031 (cheaper)

    def _new_second(self, created: float) -> float:
        """Make the second ``created`` falls in the current one (``_stamp`` its text); returns it.

        Raises:
            OverflowError, OSError: no local time for ``created`` (the current second stays).
        """
        second = float(math.floor(created))  # a float: compared and subtracted from floats
        self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        self._second = second
        return second


#: The milliseconds of a stamp, ``"000"`` to ``"999"``, by their value.
_MILLIS: Final = tuple(f"{ms:03d}" for ms in range(1000))


def _milliseconds(seconds: float) -> str:
    """``seconds`` as the JSON text of milliseconds with three decimals (``"0.123"``)."""
    return "%.3f" % (seconds * 1000)


def direct_handler(logger: logging.Logger) -> AccessLogHandler | None:
    """The :class:`AccessLogHandler` that alone receives ``logger``'s INFO records, if any.

    Only then may the journal skip ``logging`` and call :meth:`AccessLogHandler.write_requests`:
    no other handler, no propagation to other handlers and no filter would see the line.
    """
    handlers = logger.handlers
    if len(handlers) != 1 or logger.propagate or logger.filters:
        return None
    handler = handlers[0]
    if type(handler) is AccessLogHandler and handler.level <= logging.INFO and not handler.filters:
        return handler
    return None
