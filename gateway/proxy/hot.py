"""The cache-hit path's speed-up, in one place: :class:`HotProxy`, the proxy the app serves.

The override below is the fast version of one plain method of
:class:`~gateway.proxy.handler.Proxy`, marked with the name of the method it stands in for, and
must answer exactly as it does: ``tests/proxy/test_hot.py`` sends generated requests through a
gateway built on each and compares the responses byte for byte. ``create_app(..., hot_path=False)``
(``mcp-gateway serve --plain-path``) serves the plain ``Proxy``; the benchmark measures both
(bench/RESULTS.md).

What it buys, on a cached ``tools/list`` (bench/RESULTS.md): ``hit`` answers with a ``200 OK``
of ready bytes built without ``web.Response``'s argument handling and header conversion
(:class:`LeanResponse`).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from multidict import CIMultiDict, istr

from ..cache import CacheEntry
from ..cache.readthrough import COALESCED, HIT, SHARED
from ..codec import id_json
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
    """:class:`Proxy` with the hit path's speed-up (see the module)."""

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
