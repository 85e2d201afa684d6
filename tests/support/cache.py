"""Requests, answers and keys for the cache's unit tests (tests/cache/), built without a socket."""

from __future__ import annotations

from typing import Any

import orjson
from multidict import CIMultiDict

from gateway.cache import CacheKey, make_key
from gateway.protocol import ParsedRequest, parse_request

from .wire import mcp_headers, rpc


def request(method: str = "tools/list", caps: object = None, id_: object = 1, **params: Any) -> ParsedRequest:
    """A parsed modern request; ``_extra_meta`` entries are added to its ``_meta``."""
    extra_meta = params.pop("_extra_meta", {})
    raw = orjson.dumps(rpc(method, id_, caps, extra_meta, **params))
    return parse_request(raw, CIMultiDict(mcp_headers(method, params.get("uri"))))


def result(**overrides: Any) -> dict[str, Any]:
    """A public ``tools/list`` answer (ttlMs 60000, id 1); an override of None removes the member."""
    res: dict[str, Any] = {"tools": [{"name": "a"}], "resultType": "complete", "cacheScope": "public", "ttlMs": 60000}
    res.update(overrides)
    return {"jsonrpc": "2.0", "id": 1, "result": {k: v for k, v in res.items() if v is not None}}


def key(**kw: Any) -> CacheKey:
    """The key of :func:`request` ``(**kw)`` for upstream ``up``, varying on capabilities."""
    return make_key("up", request(**kw), vary_on_capabilities=True)
