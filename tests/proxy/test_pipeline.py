"""The one pipeline (gateway.proxy.pipeline): every MCP route takes its steps in the same order
(Host, Origin, the body, the token before anything about the request is told) and is recorded
the same way, whatever the route supplies."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.config import parse_config

from ..support import StartUpstream, mcp_headers, rpc

TOKEN = "pipeline-token-0123456789"
#: (HTTP method, path): every MCP route, configured upstream or not.
ROUTES = [
    ("POST", "/servers/up/mcp"),
    ("POST", "/servers/nope/mcp"),
    ("GET", "/servers/up/mcp"),
    ("DELETE", "/servers/nope/mcp"),
    ("POST", "/mcp"),
    ("GET", "/mcp"),
]


@pytest.fixture
async def client(aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream) -> TestClient[Any, Any]:
    upstream = await start_upstream()
    config = {
        "auth": {"tokens": [TOKEN]},
        "upstreams": {"up": {"url": upstream.url}},
        "aggregate": {},
        "registry": {"enabled": False},
    }
    app = create_app(parse_config(config, env={}))
    return await aiohttp_client(await aiohttp_server(app))


async def send(client: TestClient[Any, Any], method: str, path: str, body: bytes, **headers: str) -> tuple[int, Any]:
    resp = await client.request(method, path, data=body, headers={**mcp_headers("tools/list"), **headers})
    payload = await resp.json()
    assert payload["jsonrpc"] == "2.0" and "Cache-Status" in resp.headers
    return resp.status, payload.get("error", {}).get("code")


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_checks_host_then_origin_then_the_token_before_telling_anything_else(
    client: TestClient[Any, Any], method: str, path: str
) -> None:
    bad = b"{not json"
    auth = f"Bearer {TOKEN}"
    # A foreign Host on a loopback listener is refused first: before Origin, token and body.
    assert await send(client, method, path, bad, Host="evil.example", Origin="http://evil.example") == (421, -32600)
    # Then a foreign Origin: before the token and the body.
    assert await send(client, method, path, bad, Origin="http://evil.example") == (403, -32600)
    # Then the token: a caller without one learns nothing of the body or the name.
    assert await send(client, method, path, bad) == (401, -32600)
    # With the token, the request itself: a parse error, an unknown upstream, a 405, a forward.
    status, _ = await send(client, method, path, bad, Authorization=auth)
    assert status != 401


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_records_what_it_refused_under_its_label(
    client: TestClient[Any, Any], method: str, path: str
) -> None:
    await send(client, method, path, b"{}")  # no token: 401
    text = await (await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text()
    label = "/mcp" if path == "/mcp" else "up" if "/up/" in path else "unknown"
    assert f'status="401",upstream="{label}"' in text, text


async def test_a_hit_needs_the_token_like_everything_else(client: TestClient[Any, Any]) -> None:
    body = rpc("tools/list")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(2):
        resp = await client.post("/servers/up/mcp", json=body, headers={**mcp_headers("tools/list"), **auth})
        assert resp.status == 200
    assert "hit" in resp.headers["Cache-Status"]
    resp = await client.post("/servers/up/mcp", json=body, headers=mcp_headers("tools/list"))
    assert resp.status == 401 and "hit" not in resp.headers["Cache-Status"]


@pytest.mark.parametrize("path", ["/servers/up/mcp", "/servers/nope/mcp", "/mcp"])
async def test_a_body_that_does_not_decode_is_told_only_to_an_authenticated_caller_of_a_known_route(
    client: TestClient[Any, Any], path: str
) -> None:
    headers = {**mcp_headers("tools/list"), "Content-Encoding": "gzip", "Connection": "close"}
    resp = await client.post(path, data=b"this is not gzip", headers=headers)
    assert resp.status == 401
    resp = await client.post(path, data=b"this is not gzip", headers={**headers, "Authorization": f"Bearer {TOKEN}"})
    assert resp.status == (404 if "nope" in path else 400)


async def test_a_declared_length_over_the_bound_is_413_at_once_without_waiting_for_the_body(
    client: TestClient[Any, Any],
) -> None:
    # The caller sends the headers only: the answer must not wait for a body it will not get.
    port = client.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "".join(f"{k}: {v}\r\n" for k, v in mcp_headers("tools/list").items())
    writer.write(
        f"POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"{head}Content-Length: 99999999\r\n\r\n".encode()
    )
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    assert status_line.startswith(b"HTTP/1.1 413"), status_line
