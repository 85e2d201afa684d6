"""The cache-hit path's speed-ups, all in one place: :class:`HotProxy`, the proxy the app serves.

Each override below is the fast version of one plain method of
:class:`~gateway.proxy.handler.Proxy`, marked with the name of the method it stands in for, and
must answer exactly as it does: ``tests/proxy/test_hot.py`` sends generated requests through a
gateway built on each and compares the responses byte for byte. ``create_app(..., hot_path=False)``
serves the plain ``Proxy`` (the benchmark measures both: bench/RESULTS.md).

Why each is worth it, measured on a cached ``tools/list`` (bench/RESULTS.md):

* ``read_body``: a small POST has arrived whole before the handler runs; taking it from the
  buffer skips ``Request.read()``'s chunk loop and copy.
* ``hit``: a ``200 OK`` of ready bytes built without ``web.Response``'s argument handling and
  header conversion (:class:`LeanResponse`).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from multidict import CIMultiDict, istr

from ..cache import CacheEntry
from ..codec import id_json
from ..errors import PayloadTooLarge
from .exchange import Exchange, hit_status
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
    """:class:`Proxy` with the hit path's two speed-ups (see the module)."""

    async def read_body(self, request: web.Request) -> bytes:
        # ✂ fast version of Proxy.read_body: the buffer, when the whole body is in.
        content = request.content
        if not content.is_eof():
            return await super().read_body(request)
        body = content.read_nowait()
        if len(body) > self.max_body:
            raise PayloadTooLarge(f"request body exceeds {self.max_body} bytes")
        return body
        # ✂

    def hit(self, ex: Exchange, entry: CacheEntry, *, collapsed: bool) -> web.Response:
        # ✂ fast version of Proxy.hit: the same bytes, in a LeanResponse with copied headers.
        if not LEAN_RESPONSES:
            return super().hit(ex, entry, collapsed=collapsed)
        ex.cache = "hit"
        ex.lookup = "coalesced" if collapsed else "hit"
        body, ttl_ms = entry.hit(id_json(ex.request_id), self.clock())
        ex.hit = hit_status(ttl_ms, collapsed)
        headers = _JSON_HEADERS.copy()
        headers[_CACHE_STATUS] = ex.hit
        return LeanResponse(body, headers)
        # ✂
