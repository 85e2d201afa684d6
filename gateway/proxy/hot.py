"""The cache-hit path's speed-ups, all in one place: :class:`HotProxy`, the proxy the app serves.

Each override below is the fast version of one plain method of
:class:`~gateway.proxy.handler.Proxy`, marked with the names of the methods it stands in for, and
must answer exactly as they do: ``tests/proxy/test_hot.py`` sends generated requests through a
gateway built on each and compares the responses byte for byte. ``create_app(..., hot_path=False)``
(``mcp-gateway serve --plain-path``) serves the plain ``Proxy``; the benchmark measures both
(bench/RESULTS.md).

What each buys, on a cached ``tools/list``:

* ``handle_post``: the steps of a hit in one coroutine (``Proxy.check_host``, ``check_origin``,
  ``read_body``, ``answer``, ``cache_key``), the body taken from aiohttp's buffer when it is
  complete (a small POST has arrived whole before the handler runs), instead of a chain of
  calls and awaits and ``Request.read()``'s chunk loop and copy.
* ``hit``: a ``200 OK`` of ready bytes built without ``web.Response``'s argument handling and
  header conversion (:class:`LeanResponse`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from aiohttp import hdrs, web
from multidict import CIMultiDict, istr

from ..cache import CacheEntry, make_key
from ..codec import id_json
from ..errors import PayloadTooLarge
from .exchange import LARGE_BODY_BYTES, Exchange, hit_status
from .handler import Proxy

__all__ = ["LEAN_RESPONSES", "HotProxy", "LeanResponse"]


class LeanResponse(web.Response):
    """A ``200 OK`` of ready bytes with ready headers: what ``web.Response(body=, headers=)``
    builds, without its argument handling and header copy.

    It sets the attributes ``web.Response.__init__`` sets; :data:`LEAN_RESPONSES` checks at
    import that the two agree for the aiohttp installed, and :class:`HotProxy` answers with
    ``web.Response`` when they do not.
    """

    __slots__ = ()

    def __init__(self, body: bytes, headers: CIMultiDict[str]) -> None:
        self._state = {}
        self._headers = headers
        self._status = 200
        self._reason = "OK"
        self._body = body
        self._compressed_body = None
        self._zlib_executor_size = _ZLIB_EXECUTOR_SIZE
        self._zlib_executor = None


_ZLIB_EXECUTOR_SIZE: Final = web.Response()._zlib_executor_size  # aiohttp's default


def _same_as_aiohttp() -> bool:
    """Whether :class:`LeanResponse` builds exactly what ``web.Response`` builds."""
    headers = CIMultiDict({"Content-Type": "application/json", "Cache-Status": "x"})
    try:
        lean, real = vars(LeanResponse(b"{}", headers.copy())), vars(web.Response(body=b"{}", headers=headers))
    except Exception:
        return False
    return lean == real


#: Whether cache hits are answered with :class:`LeanResponse` on this aiohttp.
LEAN_RESPONSES: Final = _same_as_aiohttp()
#: Copied for each hit: cheaper than building the headers from a dict.
_JSON_HEADERS: Final = CIMultiDict({"Content-Type": "application/json"})
_CACHE_STATUS: Final = istr("Cache-Status")


class HotProxy(Proxy):
    """:class:`Proxy` with the hit path's speed-ups (see the module)."""

    async def handle_post(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        # ✂ fast version of Proxy.handle_post and the steps it calls, up to a hit; anything but
        # a fresh entry goes on through the plain methods.
        started = time.perf_counter()
        ex = Exchange(request, request.match_info["name"] if upstream_name is None else upstream_name)
        response: web.StreamResponse | None = None
        try:
            headers = request.headers
            if self.check_hosts:  # Proxy.check_host: the common Host, else the plain method
                host = headers.get(hdrs.HOST)
                if host is not None and host not in self.hosts:
                    self.check_host(request)
            origin = headers.get(hdrs.ORIGIN)  # Proxy.check_origin: no Origin, else the plain method
            if origin is not None and origin not in self.origins:
                self.check_origin(request)
            content = request.content
            if content.is_eof() and content.exception() is None:  # Proxy.read_body, whole body in
                body = content.read_nowait()
                if len(body) > self.max_body:
                    raise PayloadTooLarge(f"request body exceeds {self.max_body} bytes")
            else:
                body = await self.read_body(request)
            ex.body = body
            parsed = self.parse(ex, body)
            self.check_auth(request, parsed.request_id)  # Proxy.answer
            upstream = self.upstreams.get(ex.upstream_name)
            if upstream is None or parsed.cache_bypass is not None or not self.caching:
                response = await self.answer(ex, parsed)  # not a lookup: the plain path
            else:
                ex.upstream = upstream
                vary, forward_authorization = self.key_options[upstream.name]  # Proxy.cache_key
                authorization = headers.get(hdrs.AUTHORIZATION, "") if forward_authorization else None
                try:
                    key = ex.key = make_key(upstream.name, parsed, vary, authorization)
                except ValueError:
                    key = None
                if key is None:
                    response = await self.answer(ex, parsed)  # not keyed: the plain path
                elif (entry := self.store.get(key)) is not None:
                    response = self.hit(ex, entry, collapsed=False)
                else:
                    response = await self.miss(ex, key)
            if ex.large:  # Proxy.handle_post
                response = await self.send(ex, response)
        except asyncio.CancelledError:
            # aiohttp cancels the handler of a caller that went away (after its whole answer
            # was written, it went away at the end: answered)
            ex.disconnected = not ex.written
            raise
        except Exception as exc:
            response = self.failed(ex, exc)
        finally:
            self.record(ex, response, started)
        return response
        # ✂

    def hit(self, ex: Exchange, entry: CacheEntry, *, collapsed: bool, shared: bool = False) -> web.StreamResponse:
        # ✂ fast version of Proxy.hit: the same bytes, in a LeanResponse with copied headers; a
        # large entry (Proxy.large_answer) goes on through the plain method.
        if not LEAN_RESPONSES or entry.size > LARGE_BODY_BYTES:
            return super().hit(ex, entry, collapsed=collapsed, shared=shared)
        ex.cache = "hit"
        ex.lookup = "coalesced" if collapsed else "shared" if shared else "hit"
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
