"""Shared plumbing for the test upstreams in this directory.

Each upstream is a real MCP server built with the official SDK (`mcp.server.MCPServer`),
served over Streamable HTTP at ``http://127.0.0.1:PORT/mcp``.  The SDK's Starlette app is
wrapped in :class:`Recorder`, a small ASGI middleware that, for every HTTP request to the MCP
endpoint, counts the JSON-RPC method(s) in the body and records the raw body bytes and the
headers exactly as received.  It serves the test-only endpoints:

* ``GET  /_counts``          -> ``{"tools/list": 2, ...}`` (one per HTTP request; a non-POST
  request counts under ``"<GET>"``/``"<DELETE>"``, an unparseable body under ``"<invalid>"``,
  a POSTed JSON-RPC response/batch entry without a method under ``"<response>"``)
* ``POST /_counts/reset``    -> clears counts *and* recorded requests
* ``GET  /_requests``        -> list of records (see :meth:`Recorder._record`)
* ``POST /_requests/reset``  -> same as ``/_counts/reset``
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from mcp.server import MCPServer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HOST = "127.0.0.1"
MCP_PATH = "/mcp"
MAX_RECORDS = 10_000


def ttl_ms_from_env(default: int = 60_000) -> int:
    return int(os.environ.get("UPSTREAM_TTL_MS", str(default)))


def _methods_of(body: bytes) -> list[str]:
    try:
        msg = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ["<invalid>"]
    items = msg if isinstance(msg, list) else [msg]
    out: list[str] = []
    for item in items:
        method = item.get("method") if isinstance(item, dict) else None
        out.append(method if isinstance(method, str) else "<response>")
    return out or ["<invalid>"]


class Recorder:
    """ASGI middleware: count + record requests to ``/mcp``, serve ``/_counts`` and ``/_requests``."""

    def __init__(self, app: ASGIApp, *, mcp_path: str = MCP_PATH) -> None:
        self.app = app
        self.mcp_path = mcp_path
        self.counts: Counter[str] = Counter()
        self.records: list[dict[str, Any]] = []

    def reset(self) -> None:
        self.counts.clear()
        self.records.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan: starts the SDK session manager
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if path in ("/_counts", "/_requests") and method == "GET":
            payload: Any = dict(self.counts) if path == "/_counts" else self.records
            await _json(send, 200, payload)
            return
        if path in ("/_counts/reset", "/_requests/reset") and method == "POST":
            self.reset()
            await _json(send, 200, {"ok": True})
            return
        if path.rstrip("/") != self.mcp_path:
            await self.app(scope, receive, send)
            return

        # Buffer the whole body, then replay it to the SDK; later receive() calls (disconnect
        # detection while streaming SSE) go to the real channel.
        chunks: list[bytes] = []
        more = True
        disconnected: Message | None = None
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = message
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        record = self._record(scope, body)

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if disconnected is not None:
                    return disconnected
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
                for k, v in message.get("headers", []):
                    if k.lower() == b"content-type":
                        record["response_content_type"] = v.decode("latin-1")
            await send(message)

        await self.app(scope, replay, send_wrapper)

    def _record(self, scope: Scope, body: bytes) -> dict[str, Any]:
        http_method: str = scope["method"]
        methods = _methods_of(body) if http_method == "POST" else [f"<{http_method}>"]
        for m in methods:
            self.counts[m] += 1
        record: dict[str, Any] = {
            # JSON-RPC method (first one if the body is a batch); "<GET>" etc. for non-POST
            "method": methods[0],
            "methods": methods,
            "http_method": http_method,
            "path": scope["path"],
            "query": scope.get("query_string", b"").decode("latin-1"),
            # body: UTF-8 text (lossy only for non-UTF-8 bytes); body_b64: the exact bytes
            "body": body.decode("utf-8", errors="replace"),
            "body_b64": base64.b64encode(body).decode("ascii"),
            # headers exactly as received: [name, value] pairs, names lower-cased by the ASGI server
            "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope.get("headers", [])],
            "status": None,
            "response_content_type": None,
        }
        if len(self.records) >= MAX_RECORDS:
            del self.records[0]
        self.records.append(record)
        return record


async def _json(send: Send, status: int, payload: Any) -> None:
    data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def port_from_argv() -> int:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} PORT")
    return int(sys.argv[1])


def serve(server: MCPServer[Any], port: int) -> None:
    """Serve ``server`` (wrapped in :class:`Recorder`) on 127.0.0.1:PORT until SIGINT/SIGTERM."""
    import uvicorn

    app = Recorder(server.streamable_http_app(streamable_http_path=MCP_PATH, host=HOST))
    uvicorn.run(app, host=HOST, port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
