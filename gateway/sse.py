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
    """

    __slots__ = ("_buf", "_data", "_max", "_started", "overflowed")

    def __init__(self, max_event_bytes: int) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._max = max_event_bytes
        self._started = False
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.overflowed:
            return []
        self._buf += chunk
        if not self._started:
            if len(self._buf) < len(_BOM) and _BOM.startswith(self._buf):
                return []  # maybe a byte order mark, split across chunks
            self._started = True
            if self._buf.startswith(_BOM):  # the stream's leading BOM is not data (WHATWG)
                self._buf = self._buf[len(_BOM) :]
        events: list[bytes] = []
        while True:
            cut = _next_line_end(self._buf)
            if cut is None:
                break
            end, nxt = cut
            line, self._buf = self._buf[:end], self._buf[nxt:]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":
                self._data.append(b"")
        if len(self._buf) + sum(len(d) for d in self._data) > self._max:
            self.overflowed = True
            self._buf, self._data = b"", []
        return events

    def finish(self) -> list[bytes]:
        """At the end of the stream: a trailing ``\\r`` ends its line (it was held back in
        case ``\\n`` followed); an event without its blank line is dropped (WHATWG)."""
        return self.feed(b"\n") if self._buf.endswith(b"\r") else []


_BOM: Final = b"\xef\xbb\xbf"


def _next_line_end(buf: bytes) -> tuple[int, int] | None:
    """Position of the first line ending in ``buf`` and of the byte after it."""
    cr, lf = buf.find(b"\r"), buf.find(b"\n")
    if cr == -1 and lf == -1:
        return None
    if cr != -1 and (lf == -1 or cr < lf):
        if cr + 1 == len(buf):
            return None  # a \r at the end may still be followed by \n
        return (cr, cr + 2) if buf[cr + 1 : cr + 2] == b"\n" else (cr, cr + 1)
    return (lf, lf + 1)

