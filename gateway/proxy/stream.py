"""Relaying an SSE answer to its caller (MCP 2026-07-28, basic/transports/streamable-http,
'Receiving Messages': notifications may come first, then the final response).

The answer to a cacheable request is read from the upstream at the upstream's pace, apart from
what its caller reads (:func:`relay_stream`): the final response is stored, and the requests
coalesced on its key answered, as soon as it has arrived, whether the caller reads on, stops
reading, or goes away. What the caller has not read yet waits in order, at most the upstream's
``max_response_bytes`` of it (then reading waits for the caller, bounded by the write deadline).
Any other stream is relayed chunk by chunk as the caller takes it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from ..cache import StoreOutcome
from ..codec import loads
from ..errors import BadGateway
from ..sse import SSEParser
from ..upstream import Upstream
from .exchange import Exchange
from .fetch import final_response

if TYPE_CHECKING:
    from .forward import Forwarder

__all__ = ["relay_stream"]

LISTEN = "subscriptions/listen"


class _ReadAhead:
    """The chunks read from the upstream that the caller has not been sent yet."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: deque[bytes] = deque()
        self.pending = 0
        self.more = asyncio.Event()  # a chunk was added, or reading ended
        self.room = asyncio.Event()  # the caller took some, or went away
        self.caller_gone = False
        self.final: dict[str, object] | None = None

    def put(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.pending += len(chunk)
        self.more.set()

    def take(self) -> bytes:
        chunk = self.chunks.popleft()
        self.pending -= len(chunk)
        self.room.set()
        return chunk


async def relay_stream(
    forwarder: Forwarder, ex: Exchange, upstream: Upstream, resp: aiohttp.ClientResponse
) -> web.StreamResponse:
    """Relay an SSE answer, never buffered whole. For a cacheable request the final JSON-RPC
    response in it is stored. If the upstream stream ends without a response to the request, a
    JSON-RPC error event ends it. A caller that goes away or is dropped (``ex.disconnected``)
    ends the relay; the upstream request is then closed (on return), which tells the upstream
    (cancellation by disconnect: basic/transports/streamable-http, 'Cancellation')."""
    headers = forwarder.passthrough_headers(ex, resp)  # sent before the stream ends: never "stored"
    headers["X-Accel-Buffering"] = "no"  # MCP 2026-07-28, streamable-http, 'Receiving Messages'
    headers["Cache-Control"] = "no-cache"
    out = web.StreamResponse(status=resp.status, headers=headers)
    parsed = ex.parsed
    request_id = parsed.request_id if parsed is not None and parsed.kind == "request" else None
    parser = SSEParser(upstream.config.max_response_bytes) if request_id is not None else None
    try:
        await out.prepare(ex.request)
        if parser is not None and ex.lead is not None:
            final = await _relay_read_ahead(forwarder, ex, upstream, resp, out, parser, request_id)
        elif parser is not None and ex.rights is not None and parsed is not None and parsed.method == LISTEN:
            final = await _relay_listen_filtered(forwarder, ex, upstream, resp, out, parser, request_id)
        else:
            final = await _relay_paced(forwarder, ex, upstream, resp, out, parser, request_id)
        if parser is not None and final is None:
            await _end_unanswered(forwarder, ex, upstream, out, parser, request_id)
        if ex.lead is not None and final is None:
            forwarder.metrics.cache_stores.labels(upstream.name, ex.method, StoreOutcome.STREAM_BROKEN).inc()
        await out.write_eof()
    except ConnectionResetError:  # CallerGone, and aiohttp's own when the transport is closing
        ex.disconnected = True
    return out


def _found(
    forwarder: Forwarder, ex: Exchange, upstream: Upstream, status: int, final: dict[str, object], size: int
) -> None:
    """The final response arrived: stored, and the coalesced followers answered, before this
    caller has read it: a caller that stops reading holds back no one else."""
    forwarder.answered(ex, upstream, status, final)
    forwarder.keep(ex, status, final, size)


async def _relay_paced(
    forwarder: Forwarder,
    ex: Exchange,
    upstream: Upstream,
    resp: aiohttp.ClientResponse,
    out: web.StreamResponse,
    parser: SSEParser | None,
    request_id: object,
) -> dict[str, object] | None:
    """Each chunk read once the caller has taken the one before; the final response, if seen."""
    final: dict[str, object] | None = None
    async for chunk in upstream.iter_stream(resp):
        if parser is not None and final is None:
            final, size = final_response(parser.feed(chunk), request_id)
            if final is not None:
                _found(forwarder, ex, upstream, resp.status, final, size)
        await forwarder.writer.write(ex.request, out, chunk)
        if parser is not None and final is None and parser.overflowed:
            # An event too large to read: an answer after it could not be seen, and relaying
            # it after the error event would give the caller two answers.
            break
    if parser is not None and final is None and not parser.overflowed:
        # A last line ended by a lone \r, held back in case \n followed, ends with the stream.
        final, size = final_response(parser.finish(), request_id)
        if final is not None:
            _found(forwarder, ex, upstream, resp.status, final, size)
    return final


def _sees(ex: Exchange, upstream: Upstream, data: bytes) -> bool:
    """Whether the caller may be told the event ``data`` of its listen stream: a
    ``notifications/resources/updated`` is about a URI, which its rights must allow."""
    try:
        message = loads(data)
    except ValueError:
        return True  # not JSON: relayed as it came, as without rules
    if not isinstance(message, dict) or message.get("method") != "notifications/resources/updated":
        return True
    params = message.get("params")
    uri = params.get("uri") if isinstance(params, dict) else None
    assert ex.rights is not None
    return type(uri) is str and ex.rights.allows("resources", upstream.name, uri)


async def _relay_listen_filtered(
    forwarder: Forwarder,
    ex: Exchange,
    upstream: Upstream,
    resp: aiohttp.ClientResponse,
    out: web.StreamResponse,
    parser: SSEParser,
    request_id: object,
) -> dict[str, object] | None:
    """A listen stream for a caller whose rights limit what it sees: event by event, each one it
    may see written again as a ``message`` event, the others dropped (a chunk with no whole
    event to send is a comment line: the caller still hears the stream is alive)."""
    final: dict[str, object] | None = None
    async for chunk in upstream.iter_stream(resp):
        events = parser.feed(chunk)
        if final is None:
            final, size = final_response(events, request_id)
            if final is not None:
                _found(forwarder, ex, upstream, resp.status, final, size)
        sent = b"".join(b"event: message\ndata: " + data + b"\n\n" for data in events if _sees(ex, upstream, data))
        await forwarder.writer.write(ex.request, out, sent or b":\n\n")
        if final is None and parser.overflowed:
            break
    return final


async def _relay_read_ahead(
    forwarder: Forwarder,
    ex: Exchange,
    upstream: Upstream,
    resp: aiohttp.ClientResponse,
    out: web.StreamResponse,
    parser: SSEParser,
    request_id: object,
) -> dict[str, object] | None:
    """A cacheable request's stream: read by a task of its own (see the module), written here."""
    state = _ReadAhead(upstream.config.max_response_bytes)
    reader = asyncio.ensure_future(_read(upstream, resp, parser, request_id, state, forwarder, ex))
    try:
        while True:
            while state.chunks:
                await forwarder.writer.write(ex.request, out, state.take())
            if reader.done():
                break
            state.more.clear()
            if not state.chunks and not reader.done():
                await state.more.wait()
    except (ConnectionResetError, asyncio.CancelledError):
        state.caller_gone = True
        state.room.set()
        await _finish_for_followers(ex, upstream, reader, state)
        raise
    reader.result()  # a bug in the reader is raised here, as one in this coroutine would be
    return state.final


async def _read(
    upstream: Upstream,
    resp: aiohttp.ClientResponse,
    parser: SSEParser,
    request_id: object,
    state: _ReadAhead,
    forwarder: Forwarder,
    ex: Exchange,
) -> None:
    try:
        async for chunk in upstream.iter_stream(resp):
            if state.final is None:
                state.final, size = final_response(parser.feed(chunk), request_id)
                if state.final is not None:
                    _found(forwarder, ex, upstream, resp.status, state.final, size)
            if state.caller_gone:
                if state.final is not None:
                    return  # the followers have their answer, and no one reads the rest
                continue
            state.put(chunk)
            if state.final is None and parser.overflowed:
                return  # see _relay_paced
            while state.pending > state.limit and not state.caller_gone:
                state.room.clear()
                await state.room.wait()
        if state.final is None and not parser.overflowed:
            state.final, size = final_response(parser.finish(), request_id)
            if state.final is not None:
                _found(forwarder, ex, upstream, resp.status, state.final, size)
    finally:
        state.more.set()


async def _finish_for_followers(
    ex: Exchange, upstream: Upstream, reader: asyncio.Future[None], state: _ReadAhead
) -> None:
    """The caller went away while its request leads its key: read on for the final response,
    at most the upstream's ``timeout_s``, so that the followers get it; then stop reading.

    A cancellation meanwhile (aiohttp cancels the handler of a caller that went away) is held
    back until then, and raised after."""
    cancelled = False
    if ex.lead is not None and ex.lead.leading and state.final is None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + upstream.config.timeout_s
        while not reader.done() and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait((reader,), timeout=left)
            except asyncio.CancelledError:
                cancelled = True
    reader.cancel()
    try:
        await asyncio.wait((reader,))
    except asyncio.CancelledError:
        cancelled = True
    if reader.done() and not reader.cancelled():
        reader.exception()  # retrieved; a caller gone is not the reader's failure
    if cancelled:
        raise asyncio.CancelledError


async def _end_unanswered(
    forwarder: Forwarder,
    ex: Exchange,
    upstream: Upstream,
    out: web.StreamResponse,
    parser: SSEParser,
    request_id: object,
) -> None:
    """The stream ended, or was cut, without the answer: end it with a JSON-RPC error."""
    write = forwarder.writer.write
    if not parser.overflowed:
        # End whatever event the upstream left unfinished, as the caller's parser will see
        # it, so that an error event after it is read on its own. Should that complete the
        # answer after all, the caller has it (not stored: the stream was cut).
        await write(ex.request, out, b"\n\n")
        if final_response(parser.feed(b"\n\n"), request_id)[0] is not None:
            return
    else:
        # The oversized event went out in part: end it with a data line that no JSON can
        # end with, so that the caller cannot take it for the answer.
        await write(ex.request, out, b"\ndata: }\n\n")
    ex.error_code = BadGateway.code
    if parser.overflowed:
        reason = f"sent an event over max_response_bytes ({upstream.config.max_response_bytes})"
    elif forwarder.closing:
        reason = "the gateway is shutting down"
    else:
        reason = "ended the stream before answering"
    error = BadGateway(f"upstream {upstream.name}: {reason}", request_id=request_id)
    await write(ex.request, out, b"event: message\ndata: " + error.body() + b"\n\n")
