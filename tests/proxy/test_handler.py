"""The MCP route (gateway.proxy) against a scripted aiohttp upstream (tests/support FakeUpstream).

Its handlers, written in each test, produce what real MCP servers will not: garbage, hangs, HTML
error pages, redirects, cut streams, wrong ids. Real SDK servers are exercised in test_e2e.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, make_mocked_request
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import STORE, create_app
from gateway.config import parse_config
from gateway.telemetry import ACCESS_LOGGER, AccessLogHandler

from ..support import FakeUpstream, StartUpstream, list_result, mcp_headers, rpc, sse_frame
from ..support.polling import wait_until

TOKEN = "gateway-token-0123456789"
ADMIN = "admin-token-0123456789ab"


class Env:
    def __init__(self, client: TestClient[Any, Any], upstream: FakeUpstream, app: web.Application) -> None:
        self.client = client
        self.upstream = upstream
        self.app = app

    async def post(
        self, msg: object, headers: dict[str, str] | None = None, name: str = "up", raw: bytes | None = None
    ) -> aiohttp.ClientResponse:
        method = msg.get("method", "x") if isinstance(msg, dict) else "x"
        hdrs = mcp_headers(method) if headers is None else headers
        data = raw if raw is not None else orjson.dumps(msg)
        return await self.client.post(f"/servers/{name}/mcp", data=data, headers=hdrs)


@pytest.fixture
async def make_env(
    aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream
) -> Callable[..., Awaitable[Env]]:
    async def make(upstream_opts: dict[str, Any] | None = None, **config: Any) -> Env:
        upstream = await start_upstream()
        cfg: dict[str, Any] = {
            "upstreams": {"up": {"url": upstream.url, **(upstream_opts or {})}},
            # These tests count every request the upstream sees: no registry probes here
            # (the registry has its own tests).
            "registry": {"enabled": False},
            **config,
        }
        app = create_app(parse_config(cfg, env={}))
        client = await aiohttp_client(await aiohttp_server(app))
        return Env(client, upstream, app)

    return make


async def jsonrpc_error(resp: aiohttp.ClientResponse) -> tuple[int, int, object]:
    body = await resp.json()
    assert body["jsonrpc"] == "2.0"
    assert "Cache-Status" in resp.headers
    return resp.status, body["error"]["code"], body.get("id")


# -- validation: nothing reaches the upstream -------------------------------------------------


async def test_unknown_upstream_is_404_with_a_jsonrpc_error(make_env: Any) -> None:
    env = await make_env()
    resp = await env.post({}, name="nope", raw=b"{not json")
    assert await jsonrpc_error(resp) == (404, -32601, None)


@pytest.mark.parametrize(
    ("raw", "headers", "expected"),
    [
        (b"{nope", None, (400, -32700, None)),
        (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]', None, (400, -32600, None)),
        (
            orjson.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"_meta": {}}}),
            None,
            (400, -32602, 5),
        ),
        (
            orjson.dumps(rpc("tools/list", id_="a")),
            mcp_headers("tools/list", **{"MCP-Protocol-Version": "2099-01-01"}),
            (400, -32020, "a"),
        ),
        (orjson.dumps(rpc("tools/list", id_=3)), mcp_headers("prompts/list"), (400, -32020, 3)),
        (orjson.dumps(rpc("tools/call", id_=4, name="add")), mcp_headers("tools/call", name="sub"), (400, -32020, 4)),
        (orjson.dumps(rpc("tools/call", id_=4, name="add")), mcp_headers("tools/call"), (400, -32020, 4)),
    ],
)
async def test_invalid_requests_get_the_spec_status_and_code_and_never_reach_upstream(
    make_env: Any, raw: bytes, headers: dict[str, str] | None, expected: tuple[int, int, object]
) -> None:
    env = await make_env()
    resp = await env.post({}, headers=headers or mcp_headers("tools/list"), raw=raw)
    assert await jsonrpc_error(resp) == expected
    assert env.upstream.requests == []


async def test_modern_meta_without_version_header_is_400_header_mismatch(make_env: Any) -> None:
    env = await make_env()
    headers = mcp_headers("tools/list")
    del headers["MCP-Protocol-Version"]
    resp = await env.post(rpc("tools/list", id_=9), headers=headers)
    assert await jsonrpc_error(resp) == (400, -32020, 9)


async def test_oversized_body_is_413_and_the_gateway_keeps_serving(make_env: Any) -> None:
    env = await make_env(listener={"max_body_bytes": 1000})
    resp = await env.post(rpc("tools/list", pad="x" * 5000))
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == -32600
    ok = await env.post(rpc("tools/list"))
    assert ok.status == 200


@pytest.mark.parametrize("size", [900, 5000])
async def test_a_body_sent_in_pieces_is_read_whole_and_bounded(make_env: Any, size: int) -> None:
    """A chunked body that arrives over time takes aiohttp's read(); one that came whole
    is taken from the buffer. Both answer the same, and both are bounded."""
    env = await make_env(listener={"max_body_bytes": 1000})
    body = orjson.dumps(rpc("tools/list", id_=5, pad="x" * (size - 180)))

    async def pieces() -> Any:
        for at in range(0, len(body), 100):
            yield body[at : at + 100]
            await asyncio.sleep(0.01)

    whole = await env.post(None, raw=body, headers=mcp_headers("tools/list"))
    chunked = await env.client.post("/servers/up/mcp", data=pieces(), headers=mcp_headers("tools/list"))
    if size > 1000:
        assert whole.status == chunked.status == 413
        assert (await whole.json())["error"]["code"] == (await chunked.json())["error"]["code"] == -32600
    else:
        assert whole.status == chunked.status == 200
        assert (await whole.json())["id"] == (await chunked.json())["id"] == 5


# -- upstream failures --------------------------------------------------------------------------


async def test_refused_upstream_is_502_with_the_callers_id(aiohttp_server: Any, aiohttp_client: Any) -> None:
    cfg = parse_config(
        {
            "upstreams": {"up": {"url": "http://127.0.0.1:9/mcp", "connect_timeout_s": 1}},
            "registry": {"enabled": False},
        },
        env={},
    )
    client = await aiohttp_client(await aiohttp_server(create_app(cfg)))
    resp = await client.post(
        "/servers/up/mcp",
        data=orjson.dumps(rpc("tools/call", id_=77, name="x")),
        headers=mcp_headers("tools/call", name="x"),
    )
    assert await jsonrpc_error(resp) == (502, -32603, 77)


async def test_hanging_upstream_is_504_and_others_stay_fast(make_env: Any) -> None:
    env = await make_env({"timeout_s": 0.3})

    async def hang(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    env.upstream.handlers["tools/call"] = hang
    slow = asyncio.create_task(
        env.post(rpc("tools/call", id_="slow", name="x"), headers=mcp_headers("tools/call", name="x"))
    )
    fast = await env.post(rpc("tools/list"))
    assert fast.status == 200 and not slow.done()
    assert await jsonrpc_error(await slow) == (504, -32603, "slow")


@pytest.mark.parametrize(
    ("status", "ctype", "payload"),
    [
        (200, "text/html", b"<html>oops</html>"),
        (200, "application/json", b"garbage{"),
        (200, "application/json", b'{"jsonrpc":"2.0","id":999,"result":{}}'),
        (200, "application/json", b'{"hello":"world"}'),
        (502, "text/html", b"<html><h1>502 Bad Gateway</h1></html>"),
        (500, "text/plain", b"Internal Server Error"),
    ],
)
async def test_non_jsonrpc_answers_become_502_with_the_callers_id(
    make_env: Any, status: int, ctype: str, payload: bytes
) -> None:
    env = await make_env()

    async def bad(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=status, body=payload, content_type=ctype)

    env.upstream.answer = bad
    resp = await env.post(rpc("tools/list", id_="x1"))
    assert await jsonrpc_error(resp) == (502, -32603, "x1")
    assert len(env.app[STORE]) == 0


async def test_redirects_are_not_followed(make_env: Any, aiohttp_server: Any) -> None:
    hits: list[str] = []

    async def target(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({})

    other = web.Application()
    other.router.add_route("*", "/{tail:.*}", target)
    other_server = await aiohttp_server(other)
    env = await make_env()

    async def redirect(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(str(other_server.make_url("/steal")))

    env.upstream.answer = redirect
    resp = await env.post(rpc("tools/list", id_=2))
    assert await jsonrpc_error(resp) == (502, -32603, 2)
    assert hits == []


async def test_upstream_4xx_jsonrpc_errors_and_auth_challenges_pass_through_unchanged(make_env: Any) -> None:
    env = await make_env()
    unsupported = {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32022, "message": "no", "data": {"supported": ["2026-07-28"], "requested": "x"}},
    }

    async def e400(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=400, body=orjson.dumps(unsupported), content_type="application/json")

    async def e401(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=401, text="", headers={"WWW-Authenticate": 'Bearer resource_metadata="https://x"'})

    env.upstream.handlers["tools/list"] = e400
    env.upstream.handlers["prompts/list"] = e401
    resp = await env.post(rpc("tools/list"))
    assert resp.status == 400 and await resp.json() == unsupported
    resp = await env.post(rpc("prompts/list"))
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == 'Bearer resource_metadata="https://x"'


async def test_oversized_upstream_response_is_502(make_env: Any) -> None:
    env = await make_env({"max_response_bytes": 2000})

    async def big(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        res = list_result(msg["id"])
        res["result"]["pad"] = "x" * 10_000
        return web.json_response(res)

    env.upstream.answer = big
    assert (await jsonrpc_error(await env.post(rpc("tools/list"))))[:2] == (502, -32603)


async def test_public_answer_over_max_entry_bytes_is_forwarded_not_stored(make_env: Any) -> None:
    env = await make_env(cache={"max_entry_bytes": 500})

    async def big(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        res = list_result(msg["id"])
        res["result"]["pad"] = "x" * 1000
        return web.json_response(res)

    env.upstream.answer = big
    for _ in range(2):
        resp = await env.post(rpc("tools/list"))
        assert resp.status == 200 and "detail=too-large" in resp.headers["Cache-Status"]
    assert env.upstream.count("tools/list") == 2


async def test_gzip_upstream_bodies_are_decoded(make_env: Any) -> None:
    env = await make_env()

    async def gz(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        resp = web.json_response(list_result(msg["id"]))
        resp.enable_compression(web.ContentCoding.gzip)
        return resp

    env.upstream.answer = gz
    resp = await env.post(rpc("tools/list", id_=3))
    assert resp.status == 200 and (await resp.json())["id"] == 3
    assert "Content-Encoding" not in resp.headers


# -- caching over HTTP --------------------------------------------------------------------------


async def test_second_public_list_is_a_hit_with_own_id(make_env: Any) -> None:
    env = await make_env()
    first = await env.post(rpc("tools/list", id_=1))
    assert "fwd=miss" in first.headers["Cache-Status"] and "stored" in first.headers["Cache-Status"]
    second = await env.post(rpc("tools/list", id_="two"))
    body = await second.json()
    assert second.headers["Cache-Status"].startswith("mcp-gateway; hit; ttl=")
    assert body["id"] == "two" and body["result"]["tools"][0]["name"] == "t"
    assert 0 < body["result"]["ttlMs"] <= 60_000
    assert env.upstream.count("tools/list") == 1


async def test_errors_are_never_cached(make_env: Any) -> None:
    env = await make_env()

    async def err(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32602, "message": "bad"}})

    env.upstream.answer = err
    for _ in range(2):
        resp = await env.post(rpc("tools/list"))
        assert "detail=error" in resp.headers["Cache-Status"]
    assert env.upstream.count("tools/list") == 2


async def test_every_mcp_response_carries_cache_status(make_env: Any) -> None:
    env = await make_env()
    for msg, hdrs in [
        (rpc("tools/list"), None),
        (rpc("tools/list"), None),
        (rpc("tools/call", name="x"), mcp_headers("tools/call", name="x")),
        ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}, {"Content-Type": "application/json"}),
        (rpc("tools/list"), mcp_headers("nope")),
    ]:
        resp = await env.post(msg, headers=hdrs)
        assert resp.headers["Cache-Status"].startswith("mcp-gateway")


# -- streaming --------------------------------------------------------------------------------


def sse(msg: object) -> bytes:
    """One SSE event, its lines ended by CRLF."""
    return sse_frame(msg, b"\r\n")


async def ping_then_hang(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
    """An upstream SSE answer that sends one keep-alive, then stays open (bounded at 30 s)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b": ping\n\n")
    await asyncio.sleep(30)
    return resp


async def test_sse_is_relayed_event_by_event_without_buffering(make_env: Any) -> None:
    env = await make_env()
    release = asyncio.Event()

    async def stream(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}))
        await release.wait()
        await resp.write(sse({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [], "resultType": "complete"}}))
        return resp

    env.upstream.handlers["tools/call"] = stream
    resp = await env.post(rpc("tools/call", name="x"), headers=mcp_headers("tools/call", name="x"))
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["X-Accel-Buffering"] == "no"
    first = await asyncio.wait_for(resp.content.readuntil(b"\r\n\r\n"), 5)
    assert b"notifications/progress" in first  # arrived while the upstream is still holding the rest
    release.set()
    rest = await asyncio.wait_for(resp.content.read(), 5)
    assert b'"result"' in rest


async def test_cacheable_sse_answer_stores_only_its_final_response(make_env: Any) -> None:
    env = await make_env()

    async def stream(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}))
        await resp.write(sse(list_result(msg["id"])))
        return resp

    env.upstream.handlers["tools/list"] = stream
    first = await env.post(rpc("tools/list", id_=1))
    assert b"notifications/progress" in await first.read()
    second = await env.post(rpc("tools/list", id_=2))
    assert second.headers["Content-Type"] == "application/json"
    body = await second.json()
    assert body["id"] == 2 and body["result"]["tools"][0]["name"] == "t"
    assert env.upstream.count("tools/list") == 1


async def test_cut_stream_ends_cleanly_with_an_error_and_stores_nothing(make_env: Any) -> None:
    env = await make_env()

    async def cut(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}))
        assert request.transport is not None
        request.transport.close()
        return resp

    env.upstream.handlers["tools/list"] = cut
    resp = await env.post(rpc("tools/list", id_=5))
    text = await resp.text()
    assert "notifications/progress" in text
    last = orjson.loads(text.strip().split("data: ")[-1])
    assert last["id"] == 5 and last["error"]["code"] == -32603
    assert len(env.app[STORE]) == 0
    assert (await env.post(rpc("prompts/list"))).status == 200  # still serving


async def test_client_disconnect_closes_the_upstream_request(make_env: Any) -> None:
    env = await make_env()

    env.upstream.handlers["subscriptions/listen"] = ping_then_hang
    resp = await env.post(rpc("subscriptions/listen", notifications={"toolsListChanged": True}))
    await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
    resp.close()
    await asyncio.wait_for(env.upstream.cancelled.wait(), 5)


async def test_notifications_get_the_upstreams_202(make_env: Any) -> None:
    env = await make_env()

    async def accept(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=202)

    env.upstream.handlers["notifications/cancelled"] = accept
    msg = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    resp = await env.post(msg, headers=mcp_headers("notifications/cancelled"))
    assert resp.status == 202 and await resp.read() == b""


async def test_legacy_get_and_delete_pass_through_with_the_session(make_env: Any) -> None:
    env = await make_env()

    async def get(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=405, headers={"Allow": "POST"})

    env.upstream.handlers["GET"] = get
    env.upstream.handlers["DELETE"] = get
    resp = await env.client.get("/servers/up/mcp", headers={"Mcp-Session-Id": "s1", "Accept": "text/event-stream"})
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    resp = await env.client.delete("/servers/up/mcp", headers={"Mcp-Session-Id": "s1"})
    assert resp.status == 405
    assert [r.headers.get("Mcp-Session-Id") for r in env.upstream.requests] == ["s1", "s1"]


# -- headers and security -----------------------------------------------------------------------


async def test_forwarded_headers_are_the_allowed_set(make_env: Any) -> None:
    env = await make_env({"headers": {"X-Upstream-Key": "k1"}})
    hdrs = mcp_headers(
        "tools/call",
        name="x",
        **{
            "Mcp-Param-Region": "eu-west",
            "Authorization": "Bearer caller",
            "Cookie": "a=b",
            "Proxy-Authorization": "x",
            "Connection": "keep-alive, X-Foo",
            "X-Foo": "1",
            "Origin-Trace": "t",
        },
    )
    body = orjson.dumps(rpc("tools/call", name="x"))
    await env.post({}, headers=hdrs, raw=body)
    seen = env.upstream.requests[-1]
    got = seen.headers
    assert seen.body == body
    assert got["Mcp-Param-Region"] == "eu-west" and got["Mcp-Name"] == "x" and got["X-Upstream-Key"] == "k1"
    for banned in ("Authorization", "Cookie", "Proxy-Authorization", "X-Foo", "Origin-Trace"):
        assert banned not in got
    assert got["Host"].startswith("127.0.0.1:")


async def test_authorization_is_forwarded_only_when_configured(make_env: Any) -> None:
    env = await make_env({"forward_authorization": True})
    await env.post(
        {}, headers=mcp_headers("tools/list", Authorization="Bearer caller"), raw=orjson.dumps(rpc("tools/list"))
    )
    assert env.upstream.requests[-1].headers["Authorization"] == "Bearer caller"


async def test_foreign_origin_is_403_even_on_a_hit(make_env: Any) -> None:
    env = await make_env(listener={"allowed_origins": ["https://ok.example"]})
    assert (await env.post(rpc("tools/list"))).status == 200
    ok = await env.post(rpc("tools/list"), headers=mcp_headers("tools/list", Origin="https://ok.example"))
    assert ok.status == 200
    bad = await env.post(rpc("tools/list"), headers=mcp_headers("tools/list", Origin="https://evil.example"))
    assert (await jsonrpc_error(bad))[:2] == (403, -32600)


async def test_gateway_auth_is_checked_before_the_cache_and_never_forwarded(make_env: Any) -> None:
    env = await make_env(auth={"tokens": [TOKEN]})
    good = mcp_headers("tools/list", Authorization=f"Bearer {TOKEN}")
    assert (await env.post(rpc("tools/list"), headers=good)).status == 200
    assert "hit" in (await env.post(rpc("tools/list"), headers=good)).headers["Cache-Status"]
    for auth in (None, "Bearer wrong-token-xxxxxxxxxxxx", f"Basic {TOKEN}", f"Bearer {TOKEN}x"):
        hdrs = mcp_headers("tools/list") if auth is None else mcp_headers("tools/list", Authorization=auth)
        resp = await env.post(rpc("tools/list", id_=8), headers=hdrs)
        assert await jsonrpc_error(resp) == (401, -32600, 8)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert all("Authorization" not in r.headers for r in env.upstream.requests)


async def test_inflight_limit_answers_503_with_retry_after(make_env: Any) -> None:
    env = await make_env({"max_inflight": 1})
    release = asyncio.Event()

    async def slow(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        await release.wait()
        return web.json_response(
            {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [], "resultType": "complete"}}
        )

    env.upstream.handlers["tools/call"] = slow
    first = asyncio.create_task(env.post(rpc("tools/call", name="x"), headers=mcp_headers("tools/call", name="x")))
    while not env.upstream.requests:  # noqa: ASYNC110 - waiting for the upstream to see the first request
        await asyncio.sleep(0.01)
    second = await env.post(rpc("tools/call", id_=2, name="x"), headers=mcp_headers("tools/call", name="x"))
    assert await jsonrpc_error(second) == (503, -32603, 2)
    assert second.headers["Retry-After"] == "1"
    release.set()
    assert (await first).status == 200


async def test_inflight_gauge_and_upstream_durations_in_metrics(make_env: Any) -> None:
    """mcp_gateway_inflight_requests is read when scraped; the time the upstream took reaches
    mcp_gateway_upstream_request_duration_seconds with the request's batch."""
    env = await make_env()
    release = asyncio.Event()

    async def slow(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        await release.wait()
        return web.json_response(
            {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [], "resultType": "complete"}}
        )

    def sample(text: str, name: str) -> float | None:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and s.labels.get("upstream") == "up":
                    return float(s.value)
        return None

    env.upstream.handlers["tools/call"] = slow
    text = await (await env.client.get("/metrics")).text()
    assert sample(text, "mcp_gateway_inflight_requests") == 0  # every upstream, from the start
    call = asyncio.create_task(env.post(rpc("tools/call", name="x"), headers=mcp_headers("tools/call", name="x")))
    while not env.upstream.requests:  # noqa: ASYNC110 - waiting for the upstream to see the request
        await asyncio.sleep(0.01)
    text = await (await env.client.get("/metrics")).text()
    assert sample(text, "mcp_gateway_inflight_requests") == 1
    await asyncio.sleep(0.05)  # the upstream takes at least 0.05 s to answer: the duration below shows it
    release.set()
    assert (await call).status == 200
    text = await (await env.client.get("/metrics")).text()
    assert sample(text, "mcp_gateway_inflight_requests") == 0
    assert sample(text, "mcp_gateway_upstream_request_duration_seconds_count") == 1
    assert sample(text, "mcp_gateway_upstream_request_duration_seconds_sum") >= 0.05  # type: ignore[operator]


async def test_admin_purge_requires_the_token_and_counts_removed_entries(make_env: Any) -> None:
    env = await make_env(admin={"token": ADMIN})
    await env.post(rpc("tools/list"))
    await env.post(rpc("prompts/list"))
    assert (await env.client.post("/admin/cache/purge")).status == 401
    resp = await env.client.post("/admin/cache/purge?method=tools/list", headers={"Authorization": f"Bearer {ADMIN}"})
    assert await resp.json() == {"purged": 1}
    resp = await env.client.post("/admin/cache/purge?upstream=up", headers={"Authorization": f"Bearer {ADMIN}"})
    assert await resp.json() == {"purged": 1}
    resp = await env.client.post("/admin/cache/purge?upstream=zz", headers={"Authorization": f"Bearer {ADMIN}"})
    assert resp.status == 400


async def test_admin_purge_with_a_misspelt_query_parameter_purges_nothing(make_env: Any) -> None:
    env = await make_env(admin={"token": ADMIN})
    await env.post(rpc("tools/list"))
    resp = await env.client.post("/admin/cache/purge?mehtod=tools/list", headers={"Authorization": f"Bearer {ADMIN}"})
    assert resp.status == 400 and "mehtod" in (await resp.json())["error"]
    assert "hit" in (await env.post(rpc("tools/list"))).headers["Cache-Status"]  # still cached


async def test_admin_routes_do_not_exist_without_an_admin_token(make_env: Any) -> None:
    env = await make_env()
    assert (await env.client.post("/admin/cache/purge")).status == 404


async def test_metrics_count_hits_and_misses(make_env: Any) -> None:
    env = await make_env()
    await env.post(rpc("tools/list"))
    await env.post(rpc("tools/list"))
    await env.post(rpc("vendor/secret-method"))  # not a spec method: labelled "other"
    await env.post(rpc("tools/call", name="x"), headers=mcp_headers("tools/call", name="x"))  # never cached
    text = await (await env.client.get("/metrics")).text()
    assert 'mcp_gateway_cache_lookups_total{method="tools/call",result="bypass",upstream="up"} 1.0' in text
    assert 'mcp_gateway_requests_total{method="other",status="200",upstream="up"} 1.0' in text
    assert "secret-method" not in text
    assert 'mcp_gateway_cache_lookups_total{method="tools/list",result="hit",upstream="up"} 1.0' in text
    assert 'mcp_gateway_cache_lookups_total{method="tools/list",result="miss",upstream="up"} 1.0' in text
    assert 'mcp_gateway_cache_stores_total{method="tools/list",outcome="stored",upstream="up"} 1.0' in text
    assert "mcp_gateway_cache_entries 1.0" in text


async def test_unknown_upstream_echoes_the_readable_id(make_env: Any) -> None:
    env = await make_env()
    resp = await env.post(rpc("tools/list", id_="x-9"), name="nope")
    assert await jsonrpc_error(resp) == (404, -32601, "x-9")


async def test_configured_upstreams_have_exact_routes_and_other_names_the_pattern(make_env: Any) -> None:
    """Each configured upstream's path is a plain route (the cheap lookup); every other name
    reaches the pattern route and its JSON-RPC 404; both answer the same methods."""
    env = await make_env(
        upstreams={"up": {"url": "http://127.0.0.1:9/mcp"}, "a.b-2": {"url": "http://127.0.0.1:9/mcp"}}
    )

    async def resource_of(method: str, path: str) -> web.AbstractResource | None:
        match = await env.app.router.resolve(make_mocked_request(method, path, app=env.app))
        return match.route.resource

    for http_method in ("POST", "GET", "DELETE"):
        for name in ("up", "a.b-2"):
            resource = await resource_of(http_method, f"/servers/{name}/mcp")
            assert type(resource) is web.PlainResource, (http_method, name)
        assert type(await resource_of(http_method, "/servers/nope/mcp")) is web.DynamicResource
    # The name comes from the route, not the path: the same answers as before.
    resp = await env.post(rpc("tools/list", id_=1), name="a.b-2")
    assert resp.status == 502  # port 9: nothing listens; the upstream "a.b-2" was asked
    resp = await env.post(rpc("tools/list", id_=2), name="a.b-3")
    assert await jsonrpc_error(resp) == (404, -32601, 2)
    for name in ("up", "nope"):
        resp = await env.client.put(f"/servers/{name}/mcp")
        assert resp.status == 405 and set(resp.headers["Allow"].split(",")) == {"DELETE", "GET", "OPTIONS", "POST"}


async def test_callers_without_a_token_cannot_probe_upstream_names(make_env: Any) -> None:
    env = await make_env(auth={"tokens": [TOKEN]})
    for name in ("up", "nope"):
        resp = await env.post(rpc("tools/list", id_=4), name=name)
        assert await jsonrpc_error(resp) == (401, -32600, 4)


async def test_shutdown_ends_relayed_streams_with_an_error_event(make_env: Any) -> None:
    env = await make_env()

    env.upstream.handlers["subscriptions/listen"] = ping_then_hang
    resp = await env.post(rpc("subscriptions/listen", id_=12, notifications={"toolsListChanged": True}))
    await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
    await env.app.shutdown()  # what the runner does first on SIGTERM
    rest = await asyncio.wait_for(resp.content.read(), 5)
    last = orjson.loads(rest.strip().split(b"data: ")[-1])
    assert last["id"] == 12 and last["error"]["code"] == -32603


async def test_listen_stream_with_keepalives_outlives_the_idle_and_total_timeouts(make_env: Any) -> None:
    env = await make_env({"stream_idle_timeout_s": 0.3, "timeout_s": 0.3})

    async def keepalive(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(10):  # 1 s in all: over three idle timeouts, but never 0.3 s of silence
            await resp.write(b": keep-alive\n\n")
            await asyncio.sleep(0.1)
        await resp.write(sse({"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete"}}))
        return resp

    env.upstream.handlers["subscriptions/listen"] = keepalive
    resp = await env.post(rpc("subscriptions/listen", id_=3, notifications={"toolsListChanged": True}))
    text = await asyncio.wait_for(resp.text(), 10)
    assert text.count(": keep-alive") == 10
    assert orjson.loads(text.strip().split("data: ")[-1]) == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {"resultType": "complete"},
    }


async def test_silent_stream_is_closed_after_the_idle_timeout_with_an_error(make_env: Any) -> None:
    env = await make_env({"stream_idle_timeout_s": 0.3})

    env.upstream.handlers["subscriptions/listen"] = ping_then_hang  # one comment, then silence
    resp = await env.post(rpc("subscriptions/listen", id_=4, notifications={"toolsListChanged": True}))
    text = await asyncio.wait_for(resp.text(), 5)
    last = orjson.loads(text.strip().split("data: ")[-1])
    assert last["id"] == 4 and last["error"]["code"] == -32603
    await asyncio.wait_for(env.upstream.cancelled.wait(), 5)  # the upstream request was closed too


async def test_access_log_has_one_line_per_request_with_its_outcome(make_env: Any) -> None:
    env = await make_env()

    async def odd_error(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        # A boolean "code" is not a JSON-RPC error code: relayed as it is, logged as null.
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": True, "message": "odd"}})

    env.upstream.handlers["tools/call"] = odd_error
    out = io.StringIO()
    logger = logging.getLogger(ACCESS_LOGGER)
    saved = (logger.handlers[:], logger.propagate, logger.level)
    logger.handlers[:] = [AccessLogHandler(out)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        await env.post(rpc("tools/list", id_=1))
        await env.post(rpc("tools/list", id_=2))
        await env.post(rpc("tools/list", id_=3), name="nope")
        await env.post(rpc("tools/call", id_=4, name="t", arguments={}), headers=mcp_headers("tools/call", "t"))
        assert out.getvalue() == ""  # recorded; the journal hands the batch on within BATCH_DELAY_S
        await wait_until(lambda: out.getvalue().count("\n") == 4, what="the batch of 4 access-log lines")
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])
    lines = [json.loads(line) for line in out.getvalue().split("\n") if line]
    assert [(x["upstream"], x["method"], x["status"], x["cache"]) for x in lines] == [
        ("up", "tools/list", 200, "miss"),
        ("up", "tools/list", 200, "hit"),
        ("unknown", "tools/list", 404, "bypass"),
        ("up", "tools/call", 200, "bypass"),
    ]
    assert lines[3]["jsonrpc_error"] is None
    assert lines[1]["cache_status"].startswith("mcp-gateway; hit; ttl=")
    assert lines[2]["jsonrpc_error"] == -32601 and all(x["http_method"] == "POST" for x in lines)
    assert all(isinstance(x["duration_ms"], float) and x["duration_ms"] >= 0 for x in lines)
