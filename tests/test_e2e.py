"""End-to-end tests: real MCP SDK upstreams behind, the gateway in-process, real clients in front.

Upstreams are the servers in ``tests/servers/`` (official ``mcp`` SDK, started once per module
through ``tests/support/fleet.py``); they count requests per JSON-RPC method (``/_counts``, reset before
every test) and record the raw bytes and headers they received (``/_requests``). The gateway
runs in-process with a fake clock, so cache expiry is tested without sleeping. In front: the
official ``mcp.Client`` and raw aiohttp requests (for headers, exact bytes and concurrency).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import mcp_types as types
import pytest
import uvicorn
from mcp import Client
from mcp.server.caching import CacheHint
from mcp.server.lowlevel import Server
from pydantic import BaseModel

from .support import (
    ACCEPT,
    CACHEABLE,
    CLIENT_INFO_KEY,
    LEGACY_V,
    NAME_FIELD,
    FakeClock,
    RunningGateway,
    StartGateway,
    V,
    mcp_headers,
    sse_events,
    wire,
)
from .support.coalescing import Followers
from .support.fleet import Upstream, fetch_counts, fetch_requests, reset_counts, run_server
from .support.polling import wait_until
from .support.reply import Reply

CLIENT_INFO = {"name": "e2e-tests", "version": "1.0.0"}
ELICIT_CAPS = {"elicitation": {"form": {}}}
UPSTREAM_TTL_MS = 60_000  # the tests/servers default
CONFIRM_KEY = "_features:ask_confirmation"  # the inputRequests key of confirm_action's resolver

pytestmark = pytest.mark.timeout(60)


# -- upstream processes (module scope: they take a second or two to start) -----------------------
# public_up and private_up are conftest's.


@pytest.fixture(scope="module")
def short_ttl_up() -> Iterator[Upstream]:
    with run_server("public_upstream", env={"UPSTREAM_TTL_MS": "300"}) as up:
        yield up


def gateway_config(public: Upstream, private: Upstream, **cache: Any) -> dict[str, Any]:
    return {
        "cache": cache,
        "upstreams": {
            "pub": {"url": public.url},
            "priv": {"url": private.url},
            "pub-fwd": {
                "url": public.url,
                "forward_authorization": True,
                "headers": {"X-Gateway-Test": "configured"},
            },
            "pub-novary": {"url": public.url, "vary_on_client_capabilities": False},
        },
    }


@pytest.fixture
async def gw(
    start_gateway: StartGateway, fake_clock: FakeClock, public_up: Upstream, private_up: Upstream
) -> RunningGateway:
    """A fresh gateway (empty cache, fake clock) in front of the public and private upstreams."""
    await reset_counts(public_up)
    await reset_counts(private_up)
    return await start_gateway(gateway_config(public_up, private_up), clock=fake_clock)


# -- raw MCP over HTTP --------------------------------------------------------------------------------


def mcp_body(
    method: str,
    params: dict[str, Any] | None = None,
    *,
    id: int | str = 1,
    caps: dict[str, Any] | None = None,
    version: str = V,
    client_info: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A modern request as an SDK client writes it, ``clientInfo`` in its ``_meta``."""
    more = {CLIENT_INFO_KEY: client_info or CLIENT_INFO, **(meta or {})}
    return wire.rpc(method, id, caps, more, version=version, **(params or {}))


async def post(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str] | None = None) -> Reply:
    async with http.post(url, data=body, headers=headers or {}) as resp:
        return Reply(resp.status, resp.headers, await resp.read())


async def rpc(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    version: str = V,
    headers: dict[str, str] | None = None,
    **body_kw: Any,
) -> Reply:
    body = mcp_body(method, params, version=version, **body_kw)
    field = NAME_FIELD.get(method)
    name = params[field] if field is not None and params is not None else None
    hdrs = {**mcp_headers(method, name, version=version), **(headers or {})}
    return await post(http, url, json.dumps(body).encode(), hdrs)


async def count(up: Upstream, method: str) -> int:
    return (await fetch_counts(up)).get(method, 0)


def assert_same_result(via: dict[str, Any], direct: dict[str, Any]) -> None:
    """Equal apart from ``ttlMs``, which may be lower on a hit but must stay positive."""
    via, direct = dict(via), dict(direct)
    if "ttlMs" in direct and direct["ttlMs"] is not None:
        ttl = via.pop("ttlMs", None)
        assert isinstance(ttl, int), via
        assert 0 < ttl <= direct.pop("ttlMs")
    assert via == direct


# -- 1. transparency -----------------------------------------------------------------------------------

OPERATIONS = [
    ("server/discover", {}),
    ("tools/list", {}),
    ("prompts/list", {}),
    ("resources/list", {}),
    ("resources/templates/list", {}),
    ("tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}}),
    ("resources/read", {"uri": "res://hello"}),
    ("resources/read", {"uri": "res://café"}),
    ("resources/read", {"uri": "res://items/42"}),
    ("prompts/get", {"name": "greet", "arguments": {"name": "Ada"}}),
]


@pytest.mark.parametrize(("method", "params"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
async def test_answer_through_gateway_equals_direct_answer_apart_from_id(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, method: str, params: dict[str, Any]
) -> None:
    direct = await rpc(http, public_up.url, method, params, id="direct-1")
    first = await rpc(http, gw.url("pub"), method, params, id=7)
    second = await rpc(http, gw.url("pub"), method, params, id="second")

    assert direct.status == first.status == second.status == 200
    assert direct.json["id"] == "direct-1"
    assert first.json["id"] == 7
    assert second.json["id"] == "second"
    for reply in (first, second):
        assert set(reply.json) == set(direct.json)
        assert reply.json["jsonrpc"] == "2.0"
        assert_same_result(reply.result, direct.result)
    # (by id, so that background probes of the gateway, if any, do not count)
    received = [r.json()["id"] for r in await fetch_requests(public_up) if r.method == method]
    if method in CACHEABLE:
        assert second.cache_hit
        assert received == ["direct-1", 7]  # the second one came from the cache
    else:
        assert not second.cache_hit
        assert received == ["direct-1", 7, "second"]


def dump(value: Any) -> dict[str, Any]:
    return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else dict(value)


async def sdk_session_results(url: str) -> dict[str, dict[str, Any]]:
    async with Client(url, mode=V, cache=None) as c:
        out = {
            "discover": await c.session.send_discover(V),
            "tools": await c.list_tools(),
            "prompts": await c.list_prompts(),
            "resources": await c.list_resources(),
            "templates": await c.list_resource_templates(),
            "add": await c.call_tool("add", {"a": 20, "b": 22}),
            "hello": await c.read_resource("res://hello"),
            "cafe": await c.read_resource("res://café"),
            "item": await c.read_resource("res://items/7"),
            "greet": await c.get_prompt("greet", {"name": "Grace"}),
        }
    return {k: dump(v) for k, v in out.items()}


async def test_sdk_client_through_gateway_sees_the_direct_results(gw: RunningGateway, public_up: Upstream) -> None:
    direct = await sdk_session_results(public_up.url)
    cold = await sdk_session_results(gw.url("pub"))
    warm = await sdk_session_results(gw.url("pub"))  # every cacheable answer now comes from the cache
    assert direct["add"]["structuredContent"] == {"result": 42}
    assert direct["cafe"]["contents"][0]["uri"] == "res://café"
    for via in (cold, warm):
        assert via.keys() == direct.keys()
        for key in direct:
            assert_same_result(via[key], direct[key])
    counts = await fetch_counts(public_up)
    for method in ("tools/list", "prompts/list", "resources/list", "resources/templates/list"):
        assert counts.get(method) == 2, (method, counts)  # direct + cold; warm was served by the gateway
    assert counts.get("resources/read") == 6  # three URIs, direct + cold
    assert counts.get("tools/call") == 3
    assert counts.get("prompts/get") == 3


# -- 2./3. cache hits and expiry --------------------------------------------------------------------


async def test_second_tools_list_within_ttl_is_served_from_cache(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, fake_clock: FakeClock
) -> None:
    first = await rpc(http, gw.url("pub"), "tools/list", id=1)
    fake_clock.advance(10)
    second = await rpc(http, gw.url("pub"), "tools/list", id="two")

    assert first.status == second.status == 200
    assert not first.cache_hit and "stored" in first.cache_params
    assert second.cache_hit
    assert second.content_type == "application/json"
    assert await count(public_up, "tools/list") == 1
    assert second.json["id"] == "two"
    assert first.result["ttlMs"] == UPSTREAM_TTL_MS
    assert 0 < second.result["ttlMs"] <= UPSTREAM_TTL_MS - 10_000  # lowered to what is left
    assert_same_result(second.result, first.result)


async def test_sdk_client_repeated_list_tools_reaches_upstream_once(gw: RunningGateway, public_up: Upstream) -> None:
    async with Client(gw.url("pub"), mode=V, cache=None) as c:
        results = [await c.list_tools() for _ in range(3)]
    async with Client(gw.url("pub"), mode=V, cache=None) as c:  # another client shares the entry
        results.append(await c.list_tools())
    assert {tuple(t.name for t in r.tools) for r in results} == {
        ("add", "echo", "slow_progress", "confirm_action", "lookup")
    }
    assert await count(public_up, "tools/list") == 1


async def test_tools_list_after_ttl_reaches_upstream_again(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, fake_clock: FakeClock
) -> None:
    await rpc(http, gw.url("pub"), "tools/list")
    fake_clock.advance(UPSTREAM_TTL_MS / 1000 - 1)
    almost = await rpc(http, gw.url("pub"), "tools/list")
    assert almost.cache_hit
    assert 0 < almost.result["ttlMs"] <= 1000
    assert await count(public_up, "tools/list") == 1

    fake_clock.advance(1.001)  # past ttlMs
    expired = await rpc(http, gw.url("pub"), "tools/list")
    assert expired.status == 200
    assert not expired.cache_hit
    assert expired.result["ttlMs"] == UPSTREAM_TTL_MS
    assert await count(public_up, "tools/list") == 2

    again = await rpc(http, gw.url("pub"), "tools/list")  # stored anew
    assert again.cache_hit
    assert await count(public_up, "tools/list") == 2


async def test_short_upstream_ttl_is_honoured(
    start_gateway: StartGateway, http: aiohttp.ClientSession, short_ttl_up: Upstream, fake_clock: FakeClock
) -> None:
    await reset_counts(short_ttl_up)
    gw = await start_gateway({"upstreams": {"short": {"url": short_ttl_up.url}}}, clock=fake_clock)
    first = await rpc(http, gw.url("short"), "prompts/list")
    assert first.result["ttlMs"] == 300
    fake_clock.advance(0.25)
    hit = await rpc(http, gw.url("short"), "prompts/list")
    assert hit.cache_hit
    assert 0 < hit.result["ttlMs"] <= 50
    fake_clock.advance(0.051)
    miss = await rpc(http, gw.url("short"), "prompts/list")
    assert not miss.cache_hit
    assert await count(short_ttl_up, "prompts/list") == 2


async def test_max_ttl_ms_caps_the_lifetime_of_an_entry(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    private_up: Upstream,
    fake_clock: FakeClock,
) -> None:
    await reset_counts(public_up)
    gw = await start_gateway(gateway_config(public_up, private_up, max_ttl_ms=2000), clock=fake_clock)
    await rpc(http, gw.url("pub"), "resources/list")
    fake_clock.advance(1.5)
    hit = await rpc(http, gw.url("pub"), "resources/list")
    assert hit.cache_hit
    assert 0 < hit.result["ttlMs"] <= 500
    fake_clock.advance(0.501)
    miss = await rpc(http, gw.url("pub"), "resources/list")
    assert not miss.cache_hit
    assert await count(public_up, "resources/list") == 2


# -- 4. private answers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params"),
    [("tools/list", {}), ("server/discover", {}), ("resources/read", {"uri": "res://hello"})],
)
async def test_private_answers_always_go_upstream(
    gw: RunningGateway, http: aiohttp.ClientSession, private_up: Upstream, method: str, params: dict[str, Any]
) -> None:
    replies = [await rpc(http, gw.url("priv"), method, params, id=i) for i in range(5)]
    for i, reply in enumerate(replies):
        assert reply.status == 200
        assert reply.json["id"] == i
        assert reply.result["cacheScope"] == "private"
        assert "detail=private" in reply.cache_params
        assert not reply.cache_hit
    assert await count(private_up, method) == 5


async def test_sdk_client_private_list_tools_reaches_upstream_every_time(
    gw: RunningGateway, private_up: Upstream
) -> None:
    async with Client(gw.url("priv"), mode=V, cache=None) as c:
        for _ in range(4):
            assert any(t.name == "add" for t in (await c.list_tools()).tools)
    assert await count(private_up, "tools/list") == 4


# -- 5. form elicitation and MRTR --------------------------------------------------------------------

CONFIRM = {"name": "confirm_action", "arguments": {"action": "deploy"}}


async def test_form_elicitation_without_capability_answers_32021_and_is_not_stored(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    direct = await rpc(http, public_up.url, "tools/call", CONFIRM, id=5)
    assert direct.status == 400 and direct.json["error"]["code"] == -32021
    replies = [await rpc(http, gw.url("pub"), "tools/call", CONFIRM, id=5) for _ in range(2)]
    for reply in replies:
        assert reply.status == 400
        assert reply.raw == direct.raw  # relayed unchanged (same id on both paths)
        assert reply.json["error"]["code"] == -32021
        assert not reply.cache_hit
    assert await count(public_up, "tools/call") == 3


async def test_form_elicitation_with_capability_answers_input_required_and_is_not_stored(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    direct = await rpc(http, public_up.url, "tools/call", CONFIRM, id=5, caps=ELICIT_CAPS)
    assert direct.status == 200 and direct.result["resultType"] == "input_required"
    replies = [await rpc(http, gw.url("pub"), "tools/call", CONFIRM, id=5, caps=ELICIT_CAPS) for _ in range(2)]
    for reply in replies:
        assert reply.status == 200
        result = reply.result
        assert result["resultType"] == "input_required"
        assert isinstance(result.pop("requestState"), str)
        expected = direct.result
        expected.pop("requestState")
        assert result == expected
        assert CONFIRM_KEY in result["inputRequests"]
        assert not reply.cache_hit
    assert await count(public_up, "tools/call") == 3


async def test_mrtr_retry_with_input_responses_completes_through_gateway(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    first = await rpc(http, gw.url("pub"), "tools/call", CONFIRM, id=1, caps=ELICIT_CAPS)
    state = first.result["requestState"]
    retry_params = {
        **CONFIRM,
        "inputResponses": {CONFIRM_KEY: {"action": "accept", "content": {"confirm": True}}},
        "requestState": state,
    }
    done = await rpc(http, gw.url("pub"), "tools/call", retry_params, id=2, caps=ELICIT_CAPS)
    assert done.status == 200
    assert done.json["id"] == 2
    assert done.result["resultType"] == "complete"
    assert done.result["structuredContent"] == {"result": "deploy: confirmed"}
    assert await count(public_up, "tools/call") == 2


async def test_sdk_client_answers_elicitation_through_gateway(gw: RunningGateway, public_up: Upstream) -> None:
    asked: list[str] = []

    async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": False})

    async with Client(gw.url("pub"), mode=V, cache=None, elicitation_callback=on_elicit) as c:
        result = await c.call_tool("confirm_action", {"action": "drop"})
    assert asked and len(asked) == 1
    assert result.structured_content == {"result": "drop: not confirmed"}
    calls = [r for r in await fetch_requests(public_up) if r.method == "tools/call"]
    assert len(calls) == 2
    assert "requestState" in calls[1].json()["params"]
    assert "inputResponses" in calls[1].json()["params"]


async def test_cacheable_request_carrying_input_responses_is_not_stored(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    params = {"uri": "res://hello", "inputResponses": {}}
    for i in range(2):
        reply = await rpc(http, gw.url("pub"), "resources/read", params, id=i)
        assert reply.status == 200 and reply.result["cacheScope"] == "public"
        assert not reply.cache_hit and "stored" not in reply.cache_params
    plain = await rpc(http, gw.url("pub"), "resources/read", {"uri": "res://hello"})
    assert not plain.cache_hit  # nothing was stored by the MRTR-shaped requests
    assert await count(public_up, "resources/read") == 3


# -- 6. byte-identical forwarding and headers ---------------------------------------------------------

ODD_BODIES = [
    (
        "tools/list",
        None,
        b'  {\n\t"params" : { "_meta" : {"io.modelcontextprotocol/clientCapabilities":{ },'
        b'\n "io.modelcontextprotocol/protocolVersion" : "2026-07-28"} } ,'
        b' "method":"tools\\/list", "id" : 11 ,"jsonrpc":"2.0"}\r\n',
    ),
    (
        "resources/read",
        "res://café",
        b'{"id":"r\\u00e9ad-1","jsonrpc":"2.0","method":"resources\\u002fread","params":{"uri":"res://caf\\u00e9",'
        b'"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
        b'"io.modelcontextprotocol/clientCapabilities":{"experimental":{"z":{"b":1},"a":{}}}}}}',
    ),
    (
        "prompts/get",
        "greet",
        b'{"method":"prompts/get","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{},'
        b'"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":'
        b'{"version":"0.0.1","name":"\\ud83d\\ude00 client"}},"arguments":{"name":"\xc3\x89mile \\"E\\""},'
        b'"name":"greet"},"jsonrpc":"2.0","id":0}',
    ),
    (
        "tools/call",
        "add",
        b'{ "jsonrpc" : "2.0" , "id" : 123456789012 , "method" : "tools/call" , "params" : { "arguments" :'
        b' { "b" : 3 , "a" : 2 } , "name" : "\\u0061dd" , "_meta" : { "io.modelcontextprotocol/protocolVersion"'
        b' : "2026-07-28" , "io.modelcontextprotocol/clientCapabilities" : { } , "progressToken" : "p\\n1" } } }',
    ),
]


async def test_upstream_receives_byte_identical_request_bodies(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    for method, name, body in ODD_BODIES:
        headers = mcp_headers(method, name)
        reply = await post(http, gw.url("pub"), body, headers)
        assert reply.status == 200, (method, reply.raw)
        assert reply.json["id"] == json.loads(body)["id"]
        assert "result" in reply.json
    recorded = await fetch_requests(public_up)
    assert [r.body for r in recorded] == [b for _, _, b in ODD_BODIES]
    assert [r.method for r in recorded] == [m for m, _, _ in ODD_BODIES]


async def test_tools_call_body_and_request_headers_reach_upstream_unchanged(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    body = (
        b'{"jsonrpc":"2.0","id":"look-1","method":"tools/call","params":{"name":"lookup",'
        b'"arguments":{"key":"k\\u00fcy","region":"eu-west"},"_meta":{"io.modelcontextprotocol/protocolVersion":'
        b'"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
    )
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    headers = {**mcp_headers("tools/call"), "Mcp-Name": "lookup", "Mcp-Param-Region": "eu-west", "traceparent": trace}
    reply = await post(http, gw.url("pub"), body, headers)
    assert reply.status == 200
    assert reply.result["structuredContent"] == {"result": "eu-west:küy"}
    (rec,) = await fetch_requests(public_up)
    assert rec.body == body
    assert rec.header("mcp-param-region") == "eu-west"
    assert rec.header("mcp-name") == "lookup"
    assert rec.header("mcp-method") == "tools/call"
    assert rec.header("mcp-protocol-version") == V
    assert rec.header("traceparent") == trace
    assert rec.header("host") == f"127.0.0.1:{public_up.port}"


async def test_authorization_is_not_forwarded_by_default(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    params = {"name": "echo", "arguments": {"text": "hi"}}
    reply = await rpc(http, gw.url("pub"), "tools/call", params, headers={"Authorization": "Bearer caller-secret"})
    assert reply.status == 200
    (rec,) = await fetch_requests(public_up)
    assert rec.header("authorization") is None
    assert rec.header("x-gateway-test") is None


async def test_authorization_is_forwarded_when_upstream_sets_forward_authorization(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    params = {"name": "echo", "arguments": {"text": "hi"}}
    reply = await rpc(http, gw.url("pub-fwd"), "tools/call", params, headers={"Authorization": "Bearer caller-secret"})
    assert reply.status == 200
    (rec,) = await fetch_requests(public_up)
    assert rec.header("authorization") == "Bearer caller-secret"
    assert rec.header("x-gateway-test") == "configured"


GATEWAY_TOKEN = "gateway-token-0123456789"


async def test_gateway_token_is_checked_before_the_cache_and_not_forwarded(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, fake_clock: FakeClock
) -> None:
    await reset_counts(public_up)
    config = {
        "auth": {"tokens": [GATEWAY_TOKEN]},
        "upstreams": {"pub": {"url": public_up.url}},
    }
    gw = await start_gateway(config, clock=fake_clock)
    bearer = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
    stored = await rpc(http, gw.url("pub"), "tools/list", id=1, headers=bearer)
    assert stored.status == 200
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
        denied = await rpc(http, gw.url("pub"), "tools/list", id=2, headers=headers)
        assert denied.status == 401
        assert denied.json["id"] == 2 and denied.json["error"]["code"] == -32600
        assert "result" not in denied.json
    hit = await rpc(http, gw.url("pub"), "tools/list", id=3, headers=bearer)
    assert hit.cache_hit
    add = {"name": "add", "arguments": {"a": 1, "b": 1}}
    call = await rpc(http, gw.url("pub"), "tools/call", add, headers=bearer)
    assert call.status == 200
    recorded = await fetch_requests(public_up)
    assert [r.method for r in recorded] == ["tools/list", "tools/call"]
    assert all(r.header("authorization") is None for r in recorded)  # the gateway's own token stays here


# -- JSON the upstream handles, beyond what the gateway's parser takes --------------------------------

BIG = 10**308  # a valid double; the sum 2e308 is not


async def test_tools_call_answer_with_a_huge_integer_passes_through(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    params = {"name": "add", "arguments": {"a": BIG, "b": BIG}}
    direct = await rpc(http, public_up.url, "tools/call", params)
    assert direct.status == 200 and direct.result["structuredContent"] == {"result": 2 * BIG}
    via = await rpc(http, gw.url("pub"), "tools/call", params)
    assert via.status == 200
    assert via.raw == direct.raw


async def test_streamed_answer_with_a_huge_integer_is_relayed_once(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    base = {"Accept": ACCEPT, "Content-Type": "application/json"}
    init = await post(http, gw.url("pub"), json.dumps(INITIALIZE).encode(), base)
    session = {**base, "Mcp-Session-Id": init.headers["Mcp-Session-Id"], "MCP-Protocol-Version": LEGACY_V}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await post(http, gw.url("pub"), json.dumps(note).encode(), session)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "add", "arguments": {"a": BIG, "b": BIG}},
    }
    reply = await post(http, gw.url("pub"), json.dumps(call).encode(), session)
    assert reply.status == 200 and reply.content_type == "text/event-stream"
    responses = [m for m in reply.messages() if m.get("id") == 2]
    assert len(responses) == 1
    assert responses[0]["result"]["structuredContent"] == {"result": 2 * BIG}


@pytest.mark.parametrize(
    ("request_id", "text"),
    [(2**64 + 1, "plain"), (1, "\\ud800 lone surrogate")],
    ids=["id-above-2**64", "lone-surrogate"],
)
async def test_request_the_upstream_accepts_is_forwarded(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, request_id: int, text: str
) -> None:
    body = (
        f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":{{"name":"echo",'
        f'"arguments":{{"text":"{text}"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
        '"io.modelcontextprotocol/clientCapabilities":{}}}}'
    ).encode()
    headers = {**mcp_headers("tools/call"), "Mcp-Name": "echo"}
    direct = await post(http, public_up.url, body, headers)
    assert direct.status == 200 and direct.json["id"] == request_id
    via = await post(http, gw.url("pub"), body, headers)
    assert via.status == 200
    assert via.raw == direct.raw


# -- 7. coalescing ------------------------------------------------------------------------------------


def mixed_ids(n: int) -> list[int | str]:
    return [i if i % 2 else f"caller-{i}" for i in range(n)]


async def test_100_concurrent_cold_tools_lists_make_one_upstream_request(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    ids = mixed_ids(100)
    replies = await asyncio.gather(*(rpc(http, gw.url("pub"), "tools/list", id=i) for i in ids))
    assert await count(public_up, "tools/list") == 1
    assert [r.status for r in replies] == [200] * 100
    got = [r.json["id"] for r in replies]
    assert got == ids
    assert [type(g) for g in got] == [type(i) for i in ids]
    reference = replies[0].result
    for r in replies:
        assert_same_result(r.result, reference)
    assert sum(r.cache_hit for r in replies) == 99


async def test_100_concurrent_private_tools_lists_make_100_upstream_requests(
    gw: RunningGateway, http: aiohttp.ClientSession, private_up: Upstream
) -> None:
    ids = mixed_ids(100)
    replies = await asyncio.gather(*(rpc(http, gw.url("priv"), "tools/list", id=i) for i in ids))
    assert await count(private_up, "tools/list") == 100
    assert [r.status for r in replies] == [200] * 100
    assert [r.json["id"] for r in replies] == ids
    assert all("detail=private" in r.cache_params for r in replies)
    assert not any(r.cache_hit for r in replies)


# -- 8. SSE ------------------------------------------------------------------------------------------


async def test_slow_progress_streams_progress_notifications_to_the_sdk_client(
    gw: RunningGateway, public_up: Upstream
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(gw.url("pub"), mode=V, cache=None) as c:
        result = await c.call_tool("slow_progress", {"steps": 3, "delay_ms": 20}, progress_callback=on_progress)
    assert result.structured_content == {"result": "done after 3 steps"}
    assert [(p, t) for p, t, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert await count(public_up, "tools/call") == 1


async def test_slow_progress_events_are_relayed_as_they_happen(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    params = {"name": "slow_progress", "arguments": {"steps": 3, "delay_ms": 200}}
    body = json.dumps(mcp_body("tools/call", params, id=9, meta={"progressToken": "tok-9"})).encode()
    loop = asyncio.get_running_loop()
    arrivals: list[tuple[float, dict[str, Any]]] = []
    async with http.post(gw.url("pub"), data=body, headers=mcp_headers("tools/call", "slow_progress")) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/event-stream"
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            events = sse_events(buf)
            arrivals.extend((loop.time(), json.loads(e)) for e in events[len(arrivals) :])
    messages = [m for _, m in arrivals]
    progress = [m for m in messages if m.get("method") == "notifications/progress"]
    assert [p["params"]["progress"] for p in progress] == [1, 2, 3]
    assert all(p["params"]["progressToken"] == "tok-9" for p in progress)
    assert messages[-1]["id"] == 9
    assert messages[-1]["result"]["structuredContent"] == {"result": "done after 3 steps"}
    # Upstream emits progress 1 at t=0 and answers at t~0.6 s: an unbuffered relay shows the gap.
    assert arrivals[-1][0] - arrivals[0][0] >= 0.3


@dataclass
class InProcessUpstream:
    url: str
    calls: list[str]  # one entry per tools/list handler run
    cancelled: list[str]  # one entry per handler run cancelled (the caller went away)
    entered: asyncio.Event = field(default_factory=asyncio.Event)  # set when a handler runs


ListTools = Callable[[Any, InProcessUpstream], Awaitable[None]]
StartSdkUpstream = Callable[[ListTools], Awaitable[InProcessUpstream]]


@pytest.fixture
async def sdk_upstream() -> AsyncIterator[StartSdkUpstream]:
    """Start an SDK (low-level ``Server``) upstream in-process, on this event loop.

    Its ``tools/list`` is public (ttlMs 60000); before answering it awaits ``before_answer(ctx, up)``,
    which may report progress (making the answer ``text/event-stream`` when the request has a
    progressToken) or take its time. Used where the tests/servers upstreams cannot do the job.
    """
    running: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(before_answer: ListTools) -> InProcessUpstream:
        up = InProcessUpstream("", [], [])

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            up.calls.append("tools/list")
            up.entered.set()
            try:
                await before_answer(ctx, up)
            except asyncio.CancelledError:
                up.cancelled.append("tools/list")
                raise
            return types.ListToolsResult(tools=[types.Tool(name="streamed", input_schema={"type": "object"})])

        srv: Server[Any] = Server(
            "in-process-upstream",
            version="1.0.0",
            cache_hints={"tools/list": CacheHint(ttl_ms=UPSTREAM_TTL_MS, scope="public")},
            on_list_tools=list_tools,
        )
        app = srv.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        task = asyncio.create_task(server.serve())
        running.append((server, task))
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        up.url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/mcp"
        return up

    yield start
    for server, _task in running:
        server.should_exit = True
    for _server, task in running:
        await task


async def report_two_steps(ctx: Any, up: InProcessUpstream) -> None:
    await ctx.session.report_progress(1, 2, "half")
    await ctx.session.report_progress(2, 2, "done")


async def test_cacheable_answer_streamed_as_sse_is_relayed_and_stored(
    start_gateway: StartGateway, http: aiohttp.ClientSession, sdk_upstream: StartSdkUpstream, fake_clock: FakeClock
) -> None:
    sse_list_upstream = await sdk_upstream(report_two_steps)
    gw = await start_gateway({"upstreams": {"sse": {"url": sse_list_upstream.url}}}, clock=fake_clock)
    streamed = await rpc(http, gw.url("sse"), "tools/list", id=1, meta={"progressToken": "p-1"})
    assert streamed.status == 200
    assert streamed.content_type == "text/event-stream"
    messages = streamed.messages()
    assert [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"] == [1, 2]
    assert streamed.json["id"] == 1
    assert "fwd=miss" in streamed.cache_params  # sent before the stream ends, so it cannot say "stored"

    fake_clock.advance(1)
    hit = await rpc(http, gw.url("sse"), "tools/list", id=2)
    assert hit.status == 200
    assert hit.content_type == "application/json"
    assert hit.cache_hit
    assert hit.json["id"] == 2
    assert_same_result(hit.result, streamed.result)
    assert hit.result["ttlMs"] < UPSTREAM_TTL_MS
    assert sse_list_upstream.calls == ["tools/list"]


async def test_followers_are_answered_when_the_coalescing_leader_disconnects(
    start_gateway: StartGateway, http: aiohttp.ClientSession, sdk_upstream: StartSdkUpstream, fake_clock: FakeClock
) -> None:
    async def take_half_a_second(ctx: Any, up: InProcessUpstream) -> None:
        await asyncio.sleep(0.5)

    up = await sdk_upstream(take_half_a_second)
    gw = await start_gateway({"upstreams": {"slow": {"url": up.url}}}, clock=fake_clock)
    joined = Followers(gw)
    leader = asyncio.create_task(rpc(http, gw.url("slow"), "tools/list", id="leader"))
    async with asyncio.timeout(5):
        await up.entered.wait()  # the leader's request is at the upstream
    followers = [asyncio.create_task(rpc(http, gw.url("slow"), "tools/list", id=i)) for i in range(5)]
    await wait_until(lambda: joined.waiting() == 5, limit_s=5, what="the 5 followers waiting on the leader")
    leader.cancel()  # the leader's caller goes away
    async with asyncio.timeout(5):
        replies = await asyncio.gather(*followers)
    assert [r.status for r in replies] == [200] * 5
    assert [r.json["id"] for r in replies] == list(range(5))
    assert all(r.result["tools"][0]["name"] == "streamed" for r in replies)
    assert up.cancelled == ["tools/list"]  # the disconnect reached the upstream
    assert 2 <= len(up.calls) <= 6


# -- 9. unsupported version -----------------------------------------------------------------------------


async def test_unsupported_version_error_reaches_client_intact_and_is_not_cached(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    direct = await rpc(http, public_up.url, "tools/list", id=3, version="2099-01-01")
    assert direct.status == 400
    assert direct.json["error"]["code"] == -32022
    replies = [await rpc(http, gw.url("pub"), "tools/list", id=3, version="2099-01-01") for _ in range(2)]
    for reply in replies:
        assert reply.status == 400
        assert reply.raw == direct.raw  # relayed unchanged (same id on both paths)
        assert reply.json["error"]["code"] == -32022
        assert V in reply.json["error"]["data"]["supported"]
        assert not reply.cache_hit and "stored" not in reply.cache_params
    assert await count(public_up, "tools/list") == 3


async def test_error_answer_to_cacheable_request_is_relayed_and_not_stored(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    params = {"uri": "res://no-such-resource"}
    direct = await rpc(http, public_up.url, "resources/read", params, id=4)
    assert "error" in direct.json
    replies = [await rpc(http, gw.url("pub"), "resources/read", params, id=4) for _ in range(2)]
    for reply in replies:
        assert reply.status == direct.status
        assert reply.raw == direct.raw
        assert not reply.cache_hit and "stored" not in reply.cache_params
    assert await count(public_up, "resources/read") == 3


# -- 10. legacy era -----------------------------------------------------------------------------------

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": LEGACY_V, "capabilities": {}, "clientInfo": CLIENT_INFO},
}


async def test_legacy_initialize_reaches_upstream_and_session_id_comes_back(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    body = json.dumps(INITIALIZE, indent=1).encode()
    base = {"Accept": ACCEPT, "Content-Type": "application/json"}
    init = await post(http, gw.url("pub"), body, base)
    assert init.status == 200
    session_id = init.headers.get("Mcp-Session-Id")
    assert session_id
    assert init.json["id"] == 1
    assert init.json["result"]["protocolVersion"] == LEGACY_V

    session = {**base, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": LEGACY_V}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await post(http, gw.url("pub"), json.dumps(note).encode(), session)).status == 202
    for i in (2, 3):
        listed = await post(
            http, gw.url("pub"), json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/list"}).encode(), session
        )
        assert listed.status == 200
        assert listed.json["id"] == i
        assert any(t["name"] == "add" for t in listed.json["result"]["tools"])
        assert not listed.cache_hit
    async with http.delete(gw.url("pub"), headers=session) as resp:
        assert resp.status < 300

    counts = await fetch_counts(public_up)
    assert counts.get("initialize") == 1
    assert counts.get("tools/list") == 2  # legacy traffic is never cached
    assert counts.get("<DELETE>") == 1
    recorded = await fetch_requests(public_up)
    assert recorded[0].body == body
    assert recorded[1].header("mcp-session-id") == session_id


async def test_legacy_sdk_client_lists_and_calls_tools_through_gateway(gw: RunningGateway, public_up: Upstream) -> None:
    async with Client(gw.url("pub"), mode="legacy", cache=None) as c:
        assert c.protocol_version == LEGACY_V
        tools = await c.list_tools()
        assert {"add", "echo"} <= {t.name for t in tools.tools}
        result = await c.call_tool("add", {"a": 40, "b": 2})
        assert result.structured_content == {"result": 42}
        again = await c.list_tools()
        assert [t.name for t in again.tools] == [t.name for t in tools.tools]
    counts = await fetch_counts(public_up)
    assert counts.get("initialize") == 1
    assert counts.get("tools/list") == 2
    assert counts.get("tools/call") == 1


# -- 11. cache key variation ------------------------------------------------------------------------


async def test_different_client_capabilities_make_separate_cache_entries(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    caps_a: dict[str, Any] = {}
    caps_b = {"elicitation": {"form": {}}, "sampling": {}}
    caps_b_reordered = {"sampling": {}, "elicitation": {"form": {}}}
    for caps in (caps_a, caps_b, caps_a, caps_b, caps_b_reordered):
        reply = await rpc(http, gw.url("pub"), "tools/list", caps=caps)
        assert reply.status == 200
    assert await count(public_up, "tools/list") == 2


async def test_same_capabilities_with_different_client_info_progress_token_and_id_share_one_entry(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    variants: list[dict[str, Any]] = [
        {"id": 1},
        {"id": "other-id"},
        {"id": 2, "client_info": {"name": "someone-else", "version": "9.9.9"}},
        {"id": 3, "meta": {"progressToken": "tok-a"}},
        {"id": 4, "meta": {"progressToken": 77}, "client_info": {"name": "x", "version": "0"}},
        {"id": 5, "headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
    ]
    replies = [await rpc(http, gw.url("pub"), "prompts/list", caps=ELICIT_CAPS, **v) for v in variants]
    assert [r.json["id"] for r in replies] == [v["id"] for v in variants]
    assert all(r.cache_hit for r in replies[1:])
    assert await count(public_up, "prompts/list") == 1


async def test_different_params_make_separate_cache_entries(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    for uri in ("res://hello", "res://café", "res://hello", "res://items/1", "res://items/2", "res://café"):
        reply = await rpc(http, gw.url("pub"), "resources/read", {"uri": uri})
        assert reply.status == 200
        assert reply.result["contents"][0]["uri"] == uri
    assert await count(public_up, "resources/read") == 4


async def test_upstream_not_varying_on_capabilities_shares_one_entry(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    for caps in ({}, ELICIT_CAPS, {"sampling": {}}):
        reply = await rpc(http, gw.url("pub-novary"), "tools/list", caps=caps)
        assert reply.status == 200
    assert await count(public_up, "tools/list") == 1
