"""Scripted members for the tests of ``POST /mcp`` under attack: what a member answers, written
in the test.

Each member is a :class:`~tests.support.FakeUpstream` in this process, so that a test is quick
and says exactly what the member answers, down to faults real SDK servers will not produce.

* :func:`listing` / :func:`tools`: handlers answering one complete page (``tools/list`` ...) with
  cache hints (``cacheScope``, ``ttlMs`` in ms); :func:`tools_result` the same result as a dict.
* :func:`called`: a ``tools/call`` handler answering ``"called <name>"``.
* :func:`member`: a started member listing those tools and answering calls of them.
* :data:`META`: a request's ``_meta`` (protocol version, client capabilities) as compact JSON text,
  for bodies written byte by byte.
* :func:`purge`: ``POST /admin/cache/purge`` with the :data:`ADMIN` token.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from ..support import FakeUpstream, RunningGateway, StartUpstream, V

#: ``handler(request, msg)`` of a :class:`~tests.support.FakeUpstream`.
Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]

#: ``[admin] token`` of the gateways whose cache a test purges.
ADMIN = "attack-tests-admin-token-0123456789"

META = json.dumps(
    {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}},
    separators=(",", ":"),
)


def result_of(msg: Any, result: dict[str, Any]) -> web.Response:
    """The JSON-RPC answer to ``msg`` with ``result``."""
    return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def list_page(
    field: str, items: list[Any], *, ttl_ms: int = 60_000, scope: str = "public", **more: Any
) -> dict[str, Any]:
    """A complete list result: ``items`` under ``field``, ``cacheScope`` ``scope``, ``ttlMs`` ``ttl_ms``."""
    return {field: items, "resultType": "complete", "cacheScope": scope, "ttlMs": ttl_ms, **more}


def tools_result(*tool_names: str, **kw: Any) -> dict[str, Any]:
    """A complete ``tools/list`` result of these tools (``kw`` as :func:`list_page`)."""
    return list_page("tools", [{"name": n, "inputSchema": {"type": "object"}} for n in tool_names], **kw)


def listing(field: str, items: list[Any], **kw: Any) -> Handler:
    """A handler answering one page of ``items`` under ``field`` (``tools``, ...)."""

    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, list_page(field, items, **kw))

    return handler


def tools(*tool_names: str, **kw: Any) -> Handler:
    """A ``tools/list`` handler answering :func:`tools_result`."""

    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(*tool_names, **kw))

    return handler


async def called(request: web.Request, msg: Any) -> web.StreamResponse:
    """``tools/call``: says which tool it was asked for."""
    text = f"called {msg['params']['name']}"
    return result_of(msg, {"content": [{"type": "text", "text": text}], "resultType": "complete"})


async def member(start_upstream: StartUpstream, *tool_names: str, **kw: Any) -> FakeUpstream:
    """A started member listing ``tool_names`` (``kw`` as :func:`list_page`) and answering their calls."""
    up = await start_upstream()
    up.handlers["tools/list"] = tools(*tool_names, **kw)
    up.handlers["tools/call"] = called
    return up


async def purge(http: aiohttp.ClientSession, gw: RunningGateway, **query: str) -> dict[str, Any]:
    """``POST /admin/cache/purge?<query>`` on ``gw`` (configured with ``admin={"token": ADMIN}``);
    its JSON answer. Fails the test unless it is a 200."""
    async with http.post(
        f"{gw.base_url}/admin/cache/purge", params=query, headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())
