"""A small modern (2026-07-28) MCP upstream written with aiohttp, scripted by the test.

:class:`ScriptedMcp` advertises the versions and capabilities the test sets, answers lists with
public cache hints, and serves ``subscriptions/listen`` streams the test drives
(:class:`ListenControl`). The registry tests use it where a real SDK server cannot be told what to
advertise or when to notify; real SDK servers are in ``tests/servers/`` (see :mod:`.fleet`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from .wire import V

SUB_KEY = "io.modelcontextprotocol/subscriptionId"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"


@dataclass
class ListenControl:
    """One ``subscriptions/listen`` stream served by :class:`ScriptedMcp`, driven by the test."""

    request_id: object
    filter: dict[str, Any]
    actions: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self, method: str, **params: Any) -> None:
        """Send a notification (stamped with the subscription id)."""
        self.actions.put_nowait(("notify", (method, params)))

    def end(self, *, graceful: bool) -> None:
        """End the stream, with the ``subscriptions/listen`` result when ``graceful``."""
        self.actions.put_nowait(("end", graceful))

    def send_raw(self, message: dict[str, Any]) -> None:
        self.actions.put_nowait(("raw", message))


Handler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


class ScriptedMcp:
    """A modern MCP upstream (aiohttp) whose discover answer and listen streams the test controls.

    ``versions``/``capabilities``/``ttl_ms`` shape ``server/discover``; ``handlers`` override
    any JSON-RPC method; ``ack_first=False`` makes listen streams send a notification before
    the acknowledgement (a protocol violation). Every request is kept in ``requests`` as
    ``(json-rpc method, headers, body)``; listen streams in ``listens``.
    """

    def __init__(
        self,
        *,
        name: str = "scripted",
        versions: list[str] | None = None,
        capabilities: dict[str, Any] | None = None,
        ttl_ms: int = 60_000,
    ) -> None:
        self.name = name
        self.versions = versions if versions is not None else [V]
        self.capabilities = capabilities if capabilities is not None else {"tools": {}}
        self.ttl_ms = ttl_ms
        self.handlers: dict[str, Handler] = {}
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.listens: list[ListenControl] = []
        self.ack_first = True
        self.new_listen = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/mcp", self.handle)
        return app

    def count(self, method: str) -> int:
        return sum(1 for m, _, _ in self.requests if m == method)

    def of(self, method: str) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
        return [r for r in self.requests if r[0] == method]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            msg = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            msg = {}
        method = msg.get("method", f"<{request.method}>") if isinstance(msg, dict) else "<batch>"
        self.requests.append((method, dict(request.headers), msg))
        handler = self.handlers.get(method)
        if handler is not None:
            return await handler(request, msg)
        if method == "server/discover":
            return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": self.discover_result()})
        if method in ("tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"):
            return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": self.list_result(method, msg)})
        if method == "subscriptions/listen":
            return await self.listen(request, msg)
        error = {"code": -32601, "message": f"Method not found: {method}"}
        return web.json_response({"jsonrpc": "2.0", "id": msg.get("id"), "error": error}, status=404)

    def discover_result(self) -> dict[str, Any]:
        return {
            "resultType": "complete",
            "supportedVersions": list(self.versions),
            "capabilities": self.capabilities,
            "instructions": f"Scripted upstream {self.name}.",
            "ttlMs": self.ttl_ms,
            "cacheScope": "public",
            "_meta": {SERVER_INFO_KEY: {"name": self.name, "version": "9.9.9", "title": "Scripted"}},
        }

    def list_result(self, method: str, msg: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"resultType": "complete", "ttlMs": 600_000, "cacheScope": "public"}
        if method == "resources/read":
            uri = msg["params"]["uri"]
            body["contents"] = [{"uri": uri, "text": f"{uri} #{self.count('resources/read')}"}]
        else:
            key = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources"}.get(method)
            body[key or "resourceTemplates"] = []
        return body

    async def listen(self, request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        control = ListenControl(msg["id"], dict(msg["params"].get("notifications", {})))
        self.listens.append(control)
        self.new_listen.set()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        meta = {SUB_KEY: control.request_id}

        async def send(message: dict[str, Any]) -> None:
            await resp.write(b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n")

        ack: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged"}
        ack["params"] = {"_meta": meta, "notifications": control.filter}
        try:
            if self.ack_first:
                await send(ack)
            else:
                await send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"_meta": meta}})
            while True:
                action, arg = await control.actions.get()
                if action == "notify":
                    method, params = arg
                    await send({"jsonrpc": "2.0", "method": method, "params": {"_meta": meta, **params}})
                elif action == "raw":
                    await send(arg)
                else:
                    if arg:
                        result = {"resultType": "complete", "_meta": meta}
                        await send({"jsonrpc": "2.0", "id": control.request_id, "result": result})
                    await resp.write_eof()
                    return resp
        finally:
            control.closed.set()
