"""Legacy-only MCP upstream (2025-11-25 and older): FastMCP from ``mcp==1.30.0``.

Usage: .tools/legacy-venv/bin/python tests/servers/legacy_upstream.py PORT
       -> http://127.0.0.1:PORT/mcp (streamable HTTP: ``initialize`` handshake, ``Mcp-Session-Id``,
          a standing GET stream, DELETE to end the session)

It runs in the separate virtual environment that ``scripts/install-tools.sh`` creates
(``.tools/legacy-venv`` with ``mcp==1.30.0``): the project's own ``mcp`` 2.x is dual-era and
cannot play a legacy-only server. It knows nothing of ``server/discover``, per-request ``_meta``
versions or cache hints; a modern request gets the SDK's bare 400 (-32600, no modern code).

Tools: ``add(a, b)``, ``echo(text)``; resource ``res://legacy``; prompt ``greet(name)``.
Test endpoints (this file cannot use ``_common.py``, which needs mcp 2.x):
* ``GET  /_requests``       -> ``[{"http_method", "method", "client", "session", "response_session",
  "status"}]``: every request to /mcp, oldest first. ``method`` is the JSON-RPC method
  (``"<GET>"``/``"<DELETE>"`` for those), ``client`` the ``clientInfo.name`` of an ``initialize``,
  ``session`` the request's ``Mcp-Session-Id``, ``response_session`` the one the answer carried.
* ``POST /_requests/reset`` -> clears them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import metadata
from typing import Any

import uvicorn
from mcp.server.fastmcp import FastMCP

HOST = "127.0.0.1"
MCP_PATH = "/mcp"
MAX_RECORDS = 10_000

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def build() -> FastMCP:
    srv = FastMCP(
        "legacy-upstream",
        instructions="Legacy-only test upstream (mcp 1.30.0, 2025-11-25 handshake).",
        host=HOST,
        streamable_http_path=MCP_PATH,
        log_level="WARNING",
    )

    @srv.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @srv.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @srv.resource("res://legacy", name="legacy", mime_type="text/plain")
    def legacy() -> str:
        return "served by a legacy-only upstream"

    @srv.prompt()
    def greet(name: str) -> str:
        """Greet someone by name."""
        return f"Hello, {name}!"

    return srv


def _describe(body: bytes) -> tuple[str, str | None]:
    """(JSON-RPC method, clientInfo name of an initialize) of a POSTed body."""
    try:
        msg = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "<invalid>", None
    if not isinstance(msg, dict):
        return "<batch>", None
    method = msg.get("method")
    if not isinstance(method, str):
        return "<response>", None
    params = msg.get("params")
    info = params.get("clientInfo") if isinstance(params, dict) else None
    client = info.get("name") if isinstance(info, dict) else None
    return method, client if isinstance(client, str) else None


class Recorder:
    """ASGI middleware: record every request to ``/mcp``; serve ``/_requests``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.records: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan: starts the SDK session manager
            return
        path, http_method = scope["path"], scope["method"]
        if path == "/_requests" and http_method == "GET":
            await _json(send, self.records)
            return
        if path == "/_requests/reset" and http_method == "POST":
            self.records.clear()
            await _json(send, {"ok": True})
            return
        if path.rstrip("/") != MCP_PATH:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        record: dict[str, Any] = {
            "http_method": http_method,
            "method": f"<{http_method}>",
            "client": None,
            "session": headers.get("mcp-session-id"),
            "response_session": None,
            "status": None,
        }
        if len(self.records) >= MAX_RECORDS:
            del self.records[0]
        self.records.append(record)
        replay = receive
        if http_method == "POST":
            chunks: list[bytes] = []
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
            record["method"], record["client"] = _describe(body)
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
                for k, v in message.get("headers", []):
                    if k.lower() == b"mcp-session-id":
                        record["response_session"] = v.decode("latin-1")
            await send(message)

        await self.app(scope, replay, send_wrapper)


async def _json(send: Send, payload: Any) -> None:
    data = json.dumps(payload).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} PORT")
    found = metadata.version("mcp")
    if not found.startswith("1."):
        raise SystemExit(f"legacy_upstream.py needs mcp 1.x, found {found}: run it with .tools/legacy-venv/bin/python")
    app = Recorder(build().streamable_http_app())
    uvicorn.run(app, host=HOST, port=int(sys.argv[1]), log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
