"""One scriptable upstream: an aiohttp app at ``/mcp`` whose answers the test writes.

    upstream = await start_upstream()                 # the conftest fixture; upstream.url is set
    upstream.handlers["tools/call"] = hang            # async def hang(request, msg) -> StreamResponse
    upstream.answer = garbage                         # what answers every other request
    upstream.requests[-1].headers["Mcp-Name"]         # every request, as it arrived
    upstream.count("tools/list")                      # how many of one JSON-RPC method

It produces what real MCP servers will not (garbage, hangs, cut streams, wrong ids); real SDK
servers are in ``tests/servers/`` (see :mod:`.fleet`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from .wire import list_result

#: ``handler(request, msg)``: ``msg`` is the body read as JSON (``None`` when it is not JSON, or is
#: ``null``).
Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Received:
    """One request as the upstream received it."""

    http_method: str
    body: bytes  # the exact bytes
    headers: CIMultiDictProxy[str]  # case-insensitive, every value of a repeated name kept
    raw_headers: tuple[tuple[bytes, bytes], ...]  # as on the wire, in order

    @property
    def method(self) -> str | None:
        """The JSON-RPC method of the body, if it has one."""
        msg = _read(self.body)
        method = msg.get("method") if isinstance(msg, dict) else None
        return method if isinstance(method, str) else None


async def answer_tools_list(request: web.Request, msg: Any) -> web.StreamResponse:
    """The default answer: a public ``tools/list`` result (ttlMs 60000) for the request's id."""
    return web.json_response(list_result(msg.get("id") if isinstance(msg, dict) else None))


class FakeUpstream:
    """An upstream whose answer per JSON-RPC method is set by the test; it records every request.

    ``handlers`` maps a JSON-RPC method to its handler; a body without one (a GET, a DELETE, a
    body that is not a JSON object with a method) is looked up by its HTTP method instead.
    ``answer`` answers whatever ``handlers`` does not name. ``cancelled`` is set when a handler
    is cancelled: the gateway closed the request.
    """

    def __init__(self, answer: Handler = answer_tools_list) -> None:
        self.answer = answer
        self.handlers: dict[str, Handler] = {}
        self.requests: list[Received] = []
        self.cancelled = asyncio.Event()
        self.url = ""  # set once it is served (the ``start_upstream`` fixture)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/mcp", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        received = Received(request.method, body, request.headers, tuple(request.raw_headers))
        self.requests.append(received)
        handler = self.handlers.get(received.method or request.method, self.answer)
        try:
            return await handler(request, _read(body))
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    def count(self, method: str, marker: str | None = None) -> int:
        """Requests for JSON-RPC ``method`` (whose body contains ``marker``, when given)."""
        return sum(1 for r in self.requests if r.method == method and (marker is None or marker.encode() in r.body))


#: ``await start_upstream(answer=None)`` (the conftest fixture) -> a served :class:`FakeUpstream`.
StartUpstream = Callable[..., Awaitable[FakeUpstream]]


def _read(body: bytes) -> Any:
    """``body`` as JSON (big integers exact, deep nesting up to the recursion limit), else None."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None
