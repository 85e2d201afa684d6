"""Helpers for the registry tests: the legacy upstream process and a scripted modern upstream.

* :class:`run_legacy_server` runs ``tests/servers/legacy_upstream.py`` (mcp 1.30.0) with the
  Python of ``.tools/legacy-venv`` (made by ``scripts/install-tools.sh``); unlike
  :class:`tests.support.fleet.run_server` it may restart on a port that was just used.
* :class:`ScriptedMcp` is a small modern (2026-07-28) MCP upstream written with aiohttp: it
  advertises the versions and capabilities the test sets, answers lists with public cache
  hints, and serves ``subscriptions/listen`` streams the test drives (:class:`ListenControl`).
* :func:`wait_until` polls a condition, bounded in time.
* :class:`FakeTime` is a fake clock and a ``sleep`` for the gateway that move only when the test
  moves them, so the registry's pauses take no real time; :class:`RecordingSleep` a ``sleep``
  that only records the pauses asked for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .support.clock import FakeClock
from .support.fleet import SERVERS_DIR, Upstream, run_server

ROOT = SERVERS_DIR.parent.parent
LEGACY_PYTHON = ROOT / ".tools" / "legacy-venv" / "bin" / "python"
V = "2026-07-28"
SUB_KEY = "io.modelcontextprotocol/subscriptionId"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"


class run_legacy_server(run_server):
    """``run_server("legacy_upstream")`` under ``.tools/legacy-venv/bin/python``.

    ``port`` may be one a stopped server just used (uvicorn binds with SO_REUSEADDR), which
    ``run_server`` itself would refuse as taken.
    """

    def __init__(self, *, port: int | None = None) -> None:
        super().__init__("legacy_upstream", python=LEGACY_PYTHON)
        if port is not None:
            self.port = port


async def legacy_requests(up: Upstream) -> list[dict[str, Any]]:
    """What legacy_upstream.py recorded (see its docstring)."""
    async with aiohttp.ClientSession() as session, session.get(f"{up.base_url}/_requests") as resp:
        resp.raise_for_status()
        return list(await resp.json())


async def wait_until(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool], *, limit_s: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``condition`` every 20 ms until it is true; fail after ``limit_s`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        outcome = condition()
        if isinstance(outcome, Awaitable):
            outcome = await outcome
        if outcome:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}")
        await asyncio.sleep(0.02)


class FakeTime(FakeClock):
    """A :class:`FakeClock` with a ``sleep``, for ``create_app(clock=..., sleep=...)``: time moves
    only by :meth:`advance`.

    ``sleep(s)`` returns once the clock has moved ``s`` seconds past the call. A test first waits
    until the code is asleep (:meth:`asleep`), then moves time, so no pause is missed.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sleepers: list[tuple[float, float, asyncio.Future[None]]] = []

    async def sleep(self, seconds: float) -> None:
        entry = (self.now + seconds, seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[2]
        finally:
            self._sleepers.remove(entry)

    async def asleep(self, seconds: float) -> None:
        """Until some task sleeps for exactly ``seconds`` (polled, bounded like :func:`wait_until`)."""
        await wait_until(
            lambda: any(s == seconds and not f.done() for _, s, f in self._sleepers), what=f"a sleep of {seconds} s"
        )

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds`` and end every sleep that is then due."""
        super().advance(seconds)
        for due, _, fut in self._sleepers:
            if due <= self.now and not fut.done():
                fut.set_result(None)


class RecordingSleep:
    """A fake ``sleep`` that records each delay in ``delays`` and returns at once; the
    ``park_after``-th call sets ``enough`` and never returns (its caller waits until cancelled)."""

    def __init__(self, *, park_after: int) -> None:
        self.delays: list[float] = []
        self.enough = asyncio.Event()
        self._park_after = park_after

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if len(self.delays) >= self._park_after:
            self.enough.set()
            await asyncio.Event().wait()  # park the caller until shutdown
        await asyncio.sleep(0)


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

        ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged"}
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
