"""The cache-hit path's speed-ups, in one place: :class:`HotProxy`, the proxy the app serves.

Each override below is the fast version of one plain method of
:class:`~gateway.proxy.handler.Proxy`, marked with the name of the method it stands in for, and
must answer exactly as it does: ``tests/proxy/test_hot.py`` sends generated requests through a
gateway built on each and compares the responses byte for byte, and the request records too.
``create_app(..., hot_path=False)`` (``mcp-gateway serve --plain-path``) serves the plain
``Proxy``; the benchmark measures both (bench/RESULTS.md).

What they buy, on a cached ``tools/list`` (bench/RESULTS.md):

- ``handle_post`` answers the commonest request, a fresh small entry's hit with no ``[auth]``
  and no rules, in one step, without the pipeline's :class:`~gateway.proxy.exchange.Exchange`
  and its step-by-step calls; whatever else it meets goes on to the plain pipeline, which
  decides it from the start (with the body, when it was taken).
- ``hit`` answers with a ``200 OK`` of ready bytes built without ``web.Response``'s argument
  handling and header conversion (:class:`LeanResponse`).
- The one-step hit's answer is sent with its head in one join, not joined first and then
  joined to its head (:class:`LeanPiecesResponse`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from aiohttp import web
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict, istr

from ..cache import CacheEntry, CacheKey
from ..cache.readthrough import COALESCED, HIT, SHARED
from ..codec import id_json
from ..errors import GatewayError
from ..protocol import TEMPLATES_MAX, Template, method_label, parse_request, request_template
from .exchange import LARGE_BODY_BYTES, Exchange, hit_status
from .handler import Proxy
from .writing import Piece

__all__ = ["LEAN_RESPONSES", "PIECES_WRITES", "HotProxy", "LeanPiecesResponse", "LeanResponse"]

log = logging.getLogger("mcp_gateway.proxy")


class LeanResponse(web.Response):
    """A ``200 OK`` of ready bytes with ready headers: what ``web.Response(body=, headers=)``
    builds, without its argument handling and header copy.

    It sets the attributes ``web.Response.__init__`` sets; :data:`LEAN_RESPONSES` checks at
    import that the two agree for the aiohttp installed, and :class:`HotProxy` answers with
    ``web.Response`` when they do not.
    """

    __slots__ = ()

    def __init__(self, body: bytes | None, headers: CIMultiDict[str]) -> None:
        self._state = {}
        self._headers = headers
        self._status = 200
        self._reason = "OK"
        self._body = body
        self._compressed_body = None
        self._zlib_executor_size = _ZLIB_EXECUTOR_SIZE
        self._zlib_executor = None


_ZLIB_EXECUTOR_SIZE: Final = web.Response()._zlib_executor_size  # aiohttp's default
_CONTENT_LENGTH: Final = istr("Content-Length")


class LeanPiecesResponse(LeanResponse):
    """A :class:`LeanResponse` whose body is ``pieces`` (:meth:`CacheEntry.hit_pieces`, ``length``
    bytes in all), sent with the status line and headers in one join.

    What it buys: aiohttp joins the head to the body (``StreamWriter._writelines``: one copy of
    the answer, on Python before 3.12.9 always); a body built by joining its pieces first is a
    second copy, and for a 19 KB ``tools/list`` that second copy is about 5% of the instructions
    the whole hit costs the server (callgrind, bench/RESULTS.md). ``Content-Length`` is set
    here, as ``web.Response`` sets it from the body's length, in the same place among the
    headers. Where aiohttp's writer is not in the state this expects (:data:`PIECES_WRITES`
    checks at import that it has the parts it reads), the pieces are joined and sent as
    ``web.Response`` sends a body.
    """

    __slots__ = ()

    def __init__(self, pieces: tuple[Piece, ...], length: int, headers: CIMultiDict[str]) -> None:
        headers[_CONTENT_LENGTH] = str(length)
        super().__init__(None, headers)
        self.pieces = pieces

    async def write_eof(self, data: bytes = b"") -> None:
        # ✂ fast version of web.Response.write_eof for a body of pieces (StreamWriter.write_eof
        # with the body joined): the head and the pieces joined once, then the same end.
        writer = self._payload_writer
        if (
            type(writer) is StreamWriter
            and not self._eof_sent
            and writer._headers_buf
            and not writer._headers_written
            and not writer.chunked
            and writer._compress is None
            and writer._on_chunk_sent is None
            and writer.on_body_write is None
        ):
            head, writer._headers_buf = writer._headers_buf, None
            writer._headers_written = True
            writer._writelines((head, *self.pieces))
            await writer.drain()  # StreamWriter.write_eof's end; then nothing is left to write
        else:
            self._body = b"".join(self.pieces)
        await super().write_eof(data)
        # ✂


def _same_as_aiohttp() -> bool:
    """Whether :class:`LeanResponse` builds exactly what ``web.Response`` builds."""
    headers = CIMultiDict({"Content-Type": "application/json", "Cache-Status": "x"})
    try:
        lean, real = vars(LeanResponse(b"{}", headers.copy())), vars(web.Response(body=b"{}", headers=headers))
    except Exception:
        return False
    return lean == real


def _writer_as_expected() -> bool:
    """Whether aiohttp's ``StreamWriter`` has the parts :class:`LeanPiecesResponse` reads."""
    writer = StreamWriter(None, None)  # type: ignore[arg-type]  # no protocol: only looked at
    names = ("_headers_buf", "_headers_written", "chunked", "_compress", "_on_chunk_sent", "on_body_write")
    return all(hasattr(writer, name) for name in names) and callable(getattr(writer, "_writelines", None))


#: Whether cache hits are answered with :class:`LeanResponse` on this aiohttp.
LEAN_RESPONSES: Final = _same_as_aiohttp()
#: Whether the one-step hit's answer is a :class:`LeanPiecesResponse` on this aiohttp.
PIECES_WRITES: Final = LEAN_RESPONSES and _writer_as_expected()
#: Copied for each hit: cheaper than building the headers from a dict.
_JSON_HEADERS: Final = CIMultiDict({"Content-Type": "application/json"})
_CACHE_STATUS: Final = istr("Cache-Status")


class HotProxy(Proxy):
    """:class:`Proxy` with the hit path's speed-ups (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pipeline = self.pipeline
        #: Whether :meth:`handle_post` answers hits itself: every caller is the anonymous one,
        #: with every right (no ``[auth]``, no rules), and LeanResponse builds web.Response.
        self.lean_hits = LEAN_RESPONSES and not pipeline.authenticator.enabled and pipeline.policy is None
        #: The cache key and method label of each request template (gateway.protocol) seen on
        #: an upstream's route, by (upstream, template): a request of a known template is
        #: neither parsed nor keyed again. At most ``TEMPLATES_MAX`` (the oldest goes first);
        #: none for upstreams whose key holds the caller's ``Authorization``.
        self.plans: dict[tuple[str, Template], tuple[CacheKey, str]] = {}
        #: Whether lean_hit raised (a bug, logged as an ERROR the first time).
        self.lean_failed = False
        self.plain_keys = {name for name, (_, forwards) in self.key_options.items() if not forwards}

    async def handle_post(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        # ✂ fast version of Proxy.handle_post (Pipeline.serve on this route) for a request on a
        # configured upstream's own route whose Host and Origin pass at a glance, whose body has
        # arrived, and whose answer is a fresh small entry: the same answer and record, in one
        # step. Anything else goes to the pipeline, which decides it from the start (with the
        # body once it is taken: it is read only once).
        pipeline = self.pipeline
        if not self.lean_hits or upstream_name is None or not pipeline.usual_connection(request):
            return await super().handle_post(request, upstream_name)
        started = time.perf_counter()
        content = request.content
        if not content.is_eof() or content.exception() is not None:
            return await pipeline.serve(self, request, upstream_name)
        body = content.read_nowait()
        try:
            response = self.lean_hit(request, upstream_name, body, started)
        except Exception:  # a bug of this path: the pipeline answers the request; told once
            log.log(logging.DEBUG if self.lean_failed else logging.ERROR, "hot path failed", exc_info=True)
            self.lean_failed = True
            response = None
        if response is None:
            return await pipeline.serve(self, request, upstream_name, body)
        return response

    def lean_hit(self, request: web.Request, name: str, body: bytes, started: float) -> LeanResponse | None:
        """The answer and record of :meth:`handle_post`'s request (``body`` its body,
        ``started`` when it came in, ``time.perf_counter()`` seconds) if it is a hit the pipeline
        would answer as :meth:`hit` does, else ``None`` (nothing answered or recorded)."""
        if len(body) > self.pipeline.max_body:
            return None
        found = request_template(body, request.headers)
        plan = None if found is None else self.plans.get((name, found[1]))
        if found is not None and plan is not None:
            # What parse_request and key gave for this template: its key, the request's own id.
            request_id: object = found[0]
            key, method = plan
        else:
            keyed = self.key_of(request, name, body)
            if keyed is None:
                return None
            request_id, key, method = keyed
            if found is not None and name in self.plain_keys:
                if len(self.plans) >= TEMPLATES_MAX:
                    del self.plans[next(iter(self.plans))]  # the oldest
                self.plans[name, found[1]] = key, method
        entry = self.store.get(key)
        if entry is None or entry.size > LARGE_BODY_BYTES:
            return None
        now = self.clock()
        if now >= entry.refresh_at:  # refresh-ahead: the plain path starts the refresh
            return None
        pieces, ttl_ms = entry.hit_pieces(id_json(request_id), now)
        length = sum(map(len, pieces))
        if length > LARGE_BODY_BYTES:  # a long id: written in chunks (Pipeline.send)
            return None
        status = hit_status(ttl_ms, False)
        headers = _JSON_HEADERS.copy()
        headers[_CACHE_STATUS] = status
        self.pipeline.record_hit(name, method, status, started)
        if PIECES_WRITES:
            return LeanPiecesResponse(pieces, length, headers)
        return LeanResponse(b"".join(pieces), headers)
        # ✂

    def key_of(self, request: web.Request, name: str, body: bytes) -> tuple[object, CacheKey, str] | None:
        """For :meth:`lean_hit` (part of the fast version): ``(id, cache key, method label)`` of
        the request ``body`` on upstream ``name``'s route as the pipeline finds them
        (:meth:`Pipeline.parse`, :meth:`key`), or ``None`` when it would answer otherwise than
        from the cache (no such upstream, a bad request, a bypass)."""
        upstream = self.upstreams.get(name)
        if upstream is None:
            return None
        try:
            parsed = parse_request(body, request.headers)
        except GatewayError:
            return None
        key, _ = self.key(upstream, parsed, request)
        return None if key is None else (parsed.request_id, key, method_label(parsed.method))

    def hit(
        self, ex: Exchange, entry: CacheEntry, *, collapsed: bool = False, shared: bool = False
    ) -> web.StreamResponse:
        # ✂ fast version of Proxy.hit: the same bytes, in a LeanResponse with copied headers; a
        # large entry (Proxy.large_answer) goes on through the plain method.
        if not LEAN_RESPONSES or entry.size > LARGE_BODY_BYTES:
            return super().hit(ex, entry, collapsed=collapsed, shared=shared)
        ex.lookup = COALESCED if collapsed else SHARED if shared else HIT
        if ex.rights is not None and ex.upstream is not None:  # Proxy.hit: the caller's view of a list
            entry = self.views.view(entry, ex.method, ex.upstream.name, ex.rights)
        now = self.clock()
        body, ttl_ms = entry.hit(id_json(ex.request_id), now)
        if now >= entry.refresh_at and ex.key is not None:  # Proxy.hit: refresh-ahead, one comparison
            self.forwarder.refresh(ex, ex.key)
        ex.hit = hit_status(ttl_ms, collapsed, shared)
        ex.large = len(body) > LARGE_BODY_BYTES
        headers = _JSON_HEADERS.copy()
        headers[_CACHE_STATUS] = ex.hit
        return LeanResponse(body, headers)
        # ✂
