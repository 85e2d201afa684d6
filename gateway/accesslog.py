"""The access log: one JSON line per MCP request, cheap enough to leave on for cache hits.

The proxy logs every MCP request to the ``mcp_gateway.access`` logger. Through the plain
``logging`` machinery (a ``LogRecord``, python-json-logger, a flush per line) a line costs more
than answering a cache hit, so ``mcp-gateway serve --log-format json`` puts an
:class:`AccessLogHandler` on that logger, and the request journal (gateway.journal) hands it
request records in batches (:meth:`AccessLogHandler.write_requests`), formatted from a
template and written in one go. Records that reach the handler through ``logging`` get the
same shape, written one by one. Anyone who configures other handlers on the logger gets the
ordinary ``logging`` path.

Request records are the tuples of gateway.records: their first items are the values of
:data:`REQUEST_FIELDS` (``duration_ms`` given in seconds), and ``ENDED`` stamps the line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import stat
import sys
import time
from typing import Any, Final, TextIO

import orjson

from .records import ENDED, JSONRPC_ERROR, REQUEST_FIELDS, SECONDS, STATUS

__all__ = ["ACCESS_LOGGER", "REQUEST_FIELDS", "AccessLogHandler", "direct_handler"]

ACCESS_LOGGER: Final = "mcp_gateway.access"

#: Writes up to this size are atomic on a pipe: lines of several worker processes sharing
#: stderr never interleave.
_ATOMIC_WRITE: Final = getattr(select, "PIPE_BUF", 512)
#: Attributes every ``LogRecord`` has; the others came in through ``extra=``.
_RECORD_ATTRS: Final = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class _JSONText(dict[str, str]):
    """str -> its JSON text (quoted, escaped), remembered: the access log writes the same few
    strings (upstream names, method labels, Cache-Status values) over and over."""

    def __missing__(self, value: str) -> str:
        if len(self) >= 4096:
            self.clear()
        text = self[value] = orjson.dumps(value).decode()
        return text


#: The fixed keys of a request line after ``asctime``, and REQUEST_FIELDS but the duration,
#: each value as JSON text; a line is ``{"asctime":...,`` + this + ``"duration_ms":...}``.
_REQUEST_FIELDS_TEXT: Final = (
    '"level":"INFO","name":"'
    + ACCESS_LOGGER
    + '","message":"request",'
    + "".join(f'"{name}":%s,' for name in REQUEST_FIELDS[:-1])
)
#: Durations are written from integer microseconds below this (about 31 years).
_MAX_SECONDS: Final = 1e9
_floor: Final = math.floor
#: "000" to "999": milliseconds as asctime writes them, and the decimals of a duration.
_THREE_DIGITS: Final = tuple(f"{i:03d}" for i in range(1000))
#: By floored milliseconds into a second: "000" to "999", and "999" for 1000 (a time a hair
#: below the next second, or below 0, can round up to it).
_MILLIS: Final = (*_THREE_DIGITS, "999")


class AccessLogHandler(logging.Handler):
    """JSON access-log lines, ``{"asctime", "level", "name", "message", **fields}``.

    The keys are those of the gateway's JSON log format (``asctime`` as ``logging`` prints
    it, local time with milliseconds). Request lines come in batches from the request journal
    (:meth:`write_requests`), records through ``logging`` one by one (:meth:`emit`); each is
    written when it comes, nothing is held back. To a regular file a batch is one
    ``write(2)``; to anything else (a pipe, a socket such as journald's) in writes of at most
    ``PIPE_BUF`` bytes that end on a line boundary, so that the lines of several workers
    sharing it never interleave.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stderr
        #: The second (``time.time()``, floored) that ``_stamp`` is the text of; none yet.
        self._second: float = math.nan
        self._stamp = ""
        self._json_text = _JSONText()
        #: The text of a line's fields but the duration, by their values (a line differs
        #: from the last one of the same request kind by its times only).
        self._fields_text: dict[tuple[Any, ...], str] = {}

    def write_requests(self, records: list[tuple[Any, ...]]) -> None:
        """Write one line per request record (gateway.records), in one go. Each line is
        stamped with the time its request ended."""
        offset = time.time() - time.perf_counter()
        fields_text = self._fields_text
        digits, millis = _THREE_DIGITS, _MILLIS
        # The stamp of the second [start, start + 1) (time.time() seconds), renewed when a
        # line falls outside it (always at first: NaN): floats compared, no int() per line.
        start = float(self._second)
        stamp = self._stamp
        lines = []
        for record in records:
            try:
                key = record[:SECONDS]
                status, error = record[STATUS], record[JSONRPC_ERROR]
                if type(status) is int and (error is None or type(error) is int):
                    try:
                        text = fields_text.get(key)
                    except TypeError:  # an unhashable value (the proxy passes none)
                        text = None
                    if text is None:
                        text = self._fields(key)
                else:
                    # Not looked up: True == 1 and 1.0 == 1 would find another line's text.
                    text = self._fields(key)
                ended = record[ENDED] + offset
                if not start <= ended < start + 1.0:
                    self._asctime(ended)  # a new second: its stamp
                    start, stamp = float(self._second), self._stamp
                seconds = record[SECONDS]
                if type(seconds) is float and 0.0 <= seconds < _MAX_SECONDS:
                    # Milliseconds with 3 decimals from integer microseconds: a fraction of
                    # what round() and repr() of a float cost (floor(), not int(): the same
                    # for these non-negative values, at half the cost).
                    us = _floor(seconds * 1_000_000 + 0.5)
                    lines.append(
                        f'{{"asctime":"{stamp},{millis[_floor((ended - start) * 1000)]}",'
                        f'{text}"duration_ms":{us // 1000}.{digits[us % 1000]}}}'
                    )
                else:
                    lines.append(
                        f'{{"asctime":"{stamp},{millis[_floor((ended - start) * 1000)]}",'
                        f'{text}"duration_ms":{_odd_json(seconds)}}}'
                    )
            except Exception:  # a log line is never worth a failed request
                with contextlib.suppress(Exception):
                    sys.stderr.write("mcp-gateway: access log line dropped\n")
        if lines:
            lines.append("")
            self._write_safely("\n".join(lines).encode())

    def _fields(self, values: tuple[Any, ...]) -> str:
        """The JSON text of the fields ``values`` (REQUEST_FIELDS but the duration), as
        ``orjson.dumps`` writes them, remembered."""
        upstream, method, http_method, status, error, cache, cache_status = values
        if (
            type(status) is int
            and (error is None or type(error) is int)
            and all(type(v) is str for v in (upstream, method, http_method, cache))
            and (cache_status is None or type(cache_status) is str)
        ):
            text = self._json_text
            # Every value as JSON text: what orjson.dumps writes for the same values.
            fields = _REQUEST_FIELDS_TEXT % (
                text[upstream],
                text[method],
                text[http_method],
                status,
                "null" if error is None else error,
                text[cache],
                "null" if cache_status is None else text[cache_status],
            )
        else:  # values of other types (the proxy passes none): a valid line all the same
            line = dict(zip(REQUEST_FIELDS, values, strict=False))
            try:
                dumped = orjson.dumps(line, default=str)
            except TypeError:  # integers beyond 64 bits
                try:
                    dumped = json.dumps(
                        line, default=str, separators=(",", ":"), ensure_ascii=False, allow_nan=False
                    ).encode()
                except ValueError:  # and NaN or an infinity: no JSON for them, their text
                    dumped = orjson.dumps({k: str(v) for k, v in line.items()})
            return '"level":"INFO","name":"' + ACCESS_LOGGER + '","message":"request",' + dumped.decode()[1:-1] + ","
        if len(self._fields_text) >= 4096:
            self._fields_text.clear()
        self._fields_text[values] = fields  # only values of the exact types above
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
        # practice on a local stream socket, so the lines of several worker processes sharing
        # it never interleave. Cut at the last line end within each PIPE_BUF (a longer line
        # goes alone, whole).
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
        """``created`` (``time.time()`` seconds) as ``logging`` writes asctime, local time with
        milliseconds; floored, so a time before 1970 is right too.

        Raises:
            OverflowError, OSError, ValueError: no local time for ``created``; the stamp of
            the last second stays as it was.
        """
        second = _floor(created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            self._second = second
        return f"{self._stamp},{_MILLIS[_floor((created - second) * 1000)]}"


def _odd_json(value: Any) -> str:
    """JSON text of a duration that is not a float: milliseconds for seconds given as an
    integer, anything else as it is."""
    if isinstance(value, (int, float)):  # seconds (a bool as 0 or 1, as it always was)
        value = round(value * 1000, 3)
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:  # integers beyond 64 bits
        return json.dumps(value, default=str)


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
