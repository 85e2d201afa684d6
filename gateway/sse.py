"""An incremental ``text/event-stream`` parser (WHATWG HTML, §9.2.5 'Parsing an event stream'),
for the SSE answers of the Streamable HTTP transport (MCP 2026-07-28,
basic/transports/streamable-http, 'Receiving Messages')."""

from __future__ import annotations

from typing import Final

__all__ = ["SSEParser"]


class SSEParser:
    """Incremental ``text/event-stream`` parser (WHATWG HTML, server-sent events).

    :meth:`feed` takes raw bytes as they arrive and returns the ``data`` payload of each
    event completed by them (multi-line data joined with ``\\n``); comments and other
    fields are ignored. When the unfinished line and event held exceed ``max_event_bytes``,
    the parser drops them and is marked ``overflowed``: every later :meth:`feed` returns
    nothing.

    Linear in its input however it is cut: a line split over many chunks is searched for its
    end only in the bytes not searched before, and the held line is moved only when a line ends.
    """

    __slots__ = ("_buf", "_data", "_data_bytes", "_max", "_scanned", "_started", "overflowed")

    def __init__(self, max_event_bytes: int) -> None:
        self._buf = bytearray()
        #: ``_buf[:_scanned]`` holds no line end (but maybe a final ``\\r``, see feed).
        self._scanned = 0
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._max = max_event_bytes
        self._started = False
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.overflowed:
            return []
        buf = self._buf
        buf += chunk
        if not self._started:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                return []  # maybe a byte order mark, split across chunks
            self._started = True
            if buf.startswith(_BOM):  # the stream's leading BOM is not data (WHATWG)
                del buf[: len(_BOM)]
        events: list[bytes] = []
        start, scan = 0, self._scanned
        # The next \r and \n at or after scan (-1: none in buf), each searched for once.
        cr, lf = buf.find(b"\r", scan), buf.find(b"\n", scan)
        while cr != -1 or lf != -1:
            if cr != -1 and (lf == -1 or cr < lf):
                if cr + 1 == len(buf):
                    scan = cr  # a \r at the end may still be followed by \n
                    break
                end, nxt = cr, cr + 2 if buf[cr + 1] == _LF else cr + 1
            else:
                end, nxt = lf, lf + 1
            self._line(bytes(buf[start:end]), events)
            start = scan = nxt
            if cr != -1 and cr < scan:
                cr = buf.find(b"\r", scan)
            if lf != -1 and lf < scan:
                lf = buf.find(b"\n", scan)
        else:
            scan = len(buf)
        if start:
            del buf[:start]
            scan -= start
        self._scanned = scan
        if len(buf) + self._data_bytes > self._max:
            self.overflowed = True
            self._buf, self._data, self._data_bytes = bytearray(), [], 0
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        """One complete line: a blank line dispatches the event, ``data`` adds to it."""
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data, self._data_bytes = [], 0
        elif line.startswith(b"data:"):
            value = line[6:] if line.startswith(b"data: ") else line[5:]
            self._data.append(value)
            self._data_bytes += len(value)
        elif line == b"data":
            self._data.append(b"")

    def finish(self) -> list[bytes]:
        """At the end of the stream: a trailing ``\\r`` ends its line (it was held back in
        case ``\\n`` followed); an event without its blank line is dropped (WHATWG)."""
        return self.feed(b"\n") if self._buf.endswith(b"\r") else []


_BOM: Final = b"\xef\xbb\xbf"
_LF: Final = 0x0A
