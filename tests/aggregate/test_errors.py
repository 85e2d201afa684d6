"""``POST /mcp``: what the gateway refuses itself (and asks no member about), the checks of the
per-upstream route held against the exposed names, and the routes around it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import STORE

from ..support import LEGACY_V, RunningGateway, StartGateway, V, mcp_headers, sentinel
from ..support.fleet import Upstream, fetch_counts, fetch_requests
from .conftest import agg, agg_url, aggregate_config, body_of, exposed, names, post, reset

pytestmark = pytest.mark.timeout(60)

TOKEN = "aggregate-token-0123456789"


@pytest.fixture
async def gw(start_gateway: StartGateway, public_up: Upstream, public_up_b: Upstream) -> RunningGateway:
    """Members ``a`` and ``b``; upstream ``x`` is configured (the same server) but no member."""
    await reset(public_up, public_up_b)
    config = aggregate_config({"a": public_up, "b": public_up_b, "x": public_up}, {"upstreams": ["a", "b"]})
    return await start_gateway(config)


async def nothing_asked(*ups: Upstream) -> None:
    for up in ups:
        assert await fetch_counts(up) == {}, up


def error_of(reply: Any) -> tuple[int, int, Any]:
    return reply.status, reply.error["code"], reply.json.get("id")


# -- names and URIs that map to no member ------------------------------------------------------------


@pytest.mark.parametrize("name", ["add", "zz__add", "x__add", "__add", "a_add", "A__add", ""])
@pytest.mark.parametrize("method", ["tools/call", "prompts/get"])
async def test_an_exposed_name_of_no_member_is_32602(
    gw: RunningGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    public_up_b: Upstream,
    method: str,
    name: str,
) -> None:
    reply = await agg(http, gw, method, {"name": name, "arguments": {}}, id="unknown")
    assert error_of(reply) == (400, -32602, "unknown"), reply.raw
    assert "detail=rejected" in reply.cache_params, reply.cache_status
    await nothing_asked(public_up, public_up_b)


@pytest.mark.parametrize(
    "uri",
    [
        "res://hello",
        "mcp-gateway:zz/res://hello",
        "mcp-gateway:x/res://hello",
        "mcp-gateway:/res://hello",
        "mcp-gateway:a",
        "mcp-gateway:res://hello",
        "MCP-GATEWAY:a/res://hello",
    ],
)
async def test_a_uri_of_no_member_is_32602(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream, uri: str
) -> None:
    reply = await agg(http, gw, "resources/read", {"uri": uri}, id=7)
    assert error_of(reply) == (400, -32602, 7), reply.raw
    await nothing_asked(public_up, public_up_b)


async def test_a_missing_name_is_32602(gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream) -> None:
    body = json.dumps(body_of("tools/call", {"arguments": {}}, id=1)).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/call"))
    assert reply.status == 400 and reply.error["code"] in (-32602, -32020), reply.raw
    await nothing_asked(public_up)


# -- the routing headers, against the exposed name ---------------------------------------------------


@pytest.mark.parametrize(
    "mcp_name",
    [
        "echo",  # the member's own name: the client must send what it put in the body
        "b__echo",
        "a__add",
        sentinel("echo"),
    ],
)
async def test_mcp_name_disagreeing_with_the_exposed_name_is_32020(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream, mcp_name: str
) -> None:
    params = {"name": "a__echo", "arguments": {"text": "x"}}
    reply = await agg(http, gw, "tools/call", params, id=2, headers={"Mcp-Name": mcp_name})
    assert error_of(reply) == (400, -32020, 2), reply.raw
    await nothing_asked(public_up, public_up_b)


async def test_mcp_name_in_its_base64_form_is_accepted(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    params = {"name": "a__echo", "arguments": {"text": "x"}}
    reply = await agg(http, gw, "tools/call", params, id=2, headers={"Mcp-Name": sentinel("a__echo")})
    assert reply.status == 200, reply.raw
    assert reply.result["structuredContent"] == {"result": "x"}


async def test_a_read_whose_mcp_name_is_the_members_uri_is_32020(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    reply = await agg(
        http, gw, "resources/read", {"uri": "mcp-gateway:a/res://hello"}, id=3, headers={"Mcp-Name": "res://hello"}
    )
    assert error_of(reply) == (400, -32020, 3), reply.raw
    await nothing_asked(public_up)


@pytest.mark.parametrize(
    "headers",
    [
        {"Mcp-Method": "tools/call"},
        {"MCP-Protocol-Version": "2099-01-01"},
    ],
)
async def test_mcp_method_and_protocol_version_headers_disagreeing_with_the_body_are_32020(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, headers: dict[str, str]
) -> None:
    reply = await agg(http, gw, "tools/list", id=4, headers=headers)
    assert error_of(reply) == (400, -32020, 4), reply.raw
    await nothing_asked(public_up)


# -- the envelope and the era ------------------------------------------------------------------------


async def test_a_request_without_meta_is_32602(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}}).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/list"))
    assert error_of(reply) == (400, -32602, 5), reply.raw
    await nothing_asked(public_up)


async def test_initialize_is_32022_with_the_supported_versions(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    params = {"protocolVersion": LEGACY_V, "capabilities": {}, "clientInfo": {"name": "legacy", "version": "1"}}
    body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    reply = await post(http, agg_url(gw), body, headers)
    assert error_of(reply) == (400, -32022, 0), reply.raw
    assert V in reply.error["data"]["supported"]
    await nothing_asked(public_up)


async def test_a_modern_initialize_is_an_unknown_method_404(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    # initialize is removed in 2026-07-28: sent as a modern request, it is a method /mcp does not
    # know (404/-32601, as the conformance suite checks), not a version it does not speak.
    body = json.dumps(body_of("initialize", {}, id=7)).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("initialize"))
    assert error_of(reply) == (404, -32601, 7), reply.raw
    await nothing_asked(public_up)


@pytest.mark.parametrize("version_header", [{"MCP-Protocol-Version": LEGACY_V}, {}])
async def test_a_legacy_request_without_meta_is_32022(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, version_header: dict[str, str]
) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    reply = await post(http, agg_url(gw), body, {**headers, **version_header})
    assert error_of(reply) == (400, -32022, 1), reply.raw
    await nothing_asked(public_up)


async def test_an_unknown_protocol_version_is_32022(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    reply = await agg(http, gw, "tools/list", id=6, version="2099-01-01")
    assert error_of(reply) == (400, -32022, 6), reply.raw
    await nothing_asked(public_up)


@pytest.mark.parametrize("method", ["ping", "logging/setLevel", "tasks/get", "resources/subscribe", "no/such"])
async def test_methods_not_served_on_the_aggregate_are_32601_404(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream, method: str
) -> None:
    params = {"level": "info"} if method == "logging/setLevel" else {}
    reply = await agg(http, gw, method, params, id="m")
    assert error_of(reply) == (404, -32601, "m"), reply.raw
    await nothing_asked(public_up, public_up_b)


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]'])
async def test_bodies_that_are_not_one_request_are_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, raw: bytes
) -> None:
    reply = await post(http, agg_url(gw), raw, mcp_headers("tools/list"))
    assert reply.status == 400
    assert reply.error["code"] in (-32700, -32600)
    await nothing_asked(public_up)


async def test_a_member_name_twice_in_one_object_is_32600(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{'
        b'"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},'
        b'"name":"a__echo","name":"b__echo","arguments":{"text":"x"}}}'
    )
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/call", "a__echo"))
    assert (reply.status, reply.error["code"]) == (400, -32600), reply.raw
    await nothing_asked(public_up, public_up_b)


@pytest.mark.parametrize("http_method", ["GET", "DELETE", "PUT"])
async def test_other_http_methods_on_the_aggregate_are_405(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, http_method: str
) -> None:
    reply = await post(http, agg_url(gw), b"", {"Accept": "text/event-stream"}, http_method=http_method)
    assert reply.status == 405, reply.raw
    assert reply.headers.get("Allow") == "POST"  # PUT too: not aiohttp's own list of routes
    assert reply.error["code"] == -32600 and "detail=rejected" in reply.cache_params, reply.raw
    await nothing_asked(public_up)


@pytest.mark.parametrize("http_method", ["GET", "DELETE"])
async def test_with_auth_other_http_methods_need_the_token_too(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, http_method: str
) -> None:
    gw = await start_gateway(aggregate_config({"a": public_up}, auth={"tokens": [TOKEN]}))
    reply = await post(http, agg_url(gw), b"", {}, http_method=http_method)
    assert reply.status == 401, reply.raw
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert (await post(http, agg_url(gw), b"", bearer, http_method=http_method)).status == 405


# -- listener checks ---------------------------------------------------------------------------------


async def test_a_foreign_origin_is_403_and_a_foreign_host_421(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    origin = await agg(http, gw, "tools/list", headers={"Origin": "https://evil.example"})
    assert origin.status == 403, origin.raw
    host = await agg(http, gw, "tools/list", headers={"Host": "evil.example"})
    assert host.status == 421, host.raw
    await nothing_asked(public_up)


async def test_a_body_over_max_body_bytes_is_413(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    await reset(public_up)
    gw = await start_gateway(aggregate_config({"a": public_up}, listener={"max_body_bytes": 2048}))
    reply = await agg(http, gw, "tools/call", {"name": "a__echo", "arguments": {"text": "x" * 4096}})
    assert reply.status == 413, reply.raw
    await nothing_asked(public_up)


# -- auth ---------------------------------------------------------------------------------------------


async def test_with_auth_no_token_is_401_before_anything_else(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    await reset(public_up)
    gw = await start_gateway(aggregate_config({"a": public_up}, auth={"tokens": [TOKEN]}))
    bad_bodies = [
        json.dumps(body_of("tools/list")).encode(),
        b"{not json",
        json.dumps(body_of("tools/call", {"name": "zz__nothing"})).encode(),
        json.dumps(body_of("ping")).encode(),
    ]
    for body in bad_bodies:
        for auth in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            reply = await post(http, agg_url(gw), body, {**mcp_headers("tools/list"), **auth})
            assert reply.status == 401, (body, auth, reply.raw)
            assert reply.error["code"] == -32600
            # RFC 6750, 3.1: a bearer token that was presented and refused is an invalid_token.
            presented = ', error="invalid_token"' if auth.get("Authorization", "").startswith("Bearer ") else ""
            assert reply.headers.get("WWW-Authenticate") == f'Bearer realm="mcp-gateway"{presented}'
    await nothing_asked(public_up)
    ok = await agg(http, gw, "tools/list", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status == 200, ok.raw
    assert await fetch_counts(public_up) == {"tools/list": 1}
    [listed] = await fetch_requests(public_up)
    assert listed.header("authorization") is None  # the token is never sent to a member


# -- without [aggregate] ------------------------------------------------------------------------------


async def test_without_an_aggregate_section_there_is_no_mcp_route(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    await reset(public_up)
    gw = await start_gateway({"upstreams": {"a": {"url": public_up.url}}})
    reply = await agg(http, gw, "tools/list")
    assert reply.status == 404, reply.raw
    # A JSON-RPC error that says why: pointing a client at /mcp is the commonest first mistake.
    error = json.loads(reply.raw)["error"]
    assert error["code"] == -32601 and "[aggregate]" in error["message"]
    get = await post(http, agg_url(gw), b"", {}, http_method="GET")
    assert get.status == 404
    await nothing_asked(public_up)
    assert (await agg(http, gw.url("a"), "tools/list")).status == 200  # the member's own route stays


# -- around the route ---------------------------------------------------------------------------------


async def test_requests_to_the_aggregate_are_counted_under_upstream_mcp(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    assert (await agg(http, gw, "tools/list")).status == 200
    assert (await agg(http, gw, "ping")).status == 404
    async with http.get(f"{gw.base_url}/metrics") as resp:
        text = await resp.text()
    samples = {
        (s.labels.get("upstream"), s.labels.get("method"), s.labels.get("status")): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "mcp_gateway_requests"
        for s in family.samples
        if s.name == "mcp_gateway_requests_total"
    }
    assert samples.get(("/mcp", "tools/list", "200")) == 1, samples
    assert samples.get(("/mcp", "ping", "404")) == 1, samples


async def test_the_registry_lists_the_aggregate_as_one_more_server(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{gw.base_url}/v0.1/servers", params={"limit": "100"}) as resp:
        assert resp.status == 200
        listing = await resp.json()
    remotes = [r["url"] for entry in listing["servers"] for r in entry["server"].get("remotes", [])]
    assert agg_url(gw) in remotes, remotes
    assert f"{gw.base_url}/servers/a/mcp" in remotes


# -- a stored part that cannot be read ------------------------------------------------------------------


async def test_a_member_whose_stored_part_does_not_parse_is_left_out_never_a_500(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    first = await agg(http, gw, "tools/list")
    assert first.status == 200 and exposed("a", "add") in names(first.result), first.raw[:300]
    store = gw.app[STORE]
    keys = [k for k in store.keys() if (k.upstream, k.method) == ("a", "tools/list")]
    assert len(keys) == 1, keys
    for head, tail in ((b',"result":{"tools":[', b',"garbage}'), (b',"result":[1,', b"]}")):
        # Not JSON, then JSON that is no result object: what a bug or a bad shared value could leave.
        entry = store.get(keys[0])
        assert entry is not None
        store.put(keys[0], dataclasses.replace(entry, head=head, tail=tail, size=len(head + tail)))
        reply = await agg(http, gw, "tools/list", id="after")
        assert reply.status == 200, reply.raw[:300]
        listed = names(reply.result)
        assert exposed("b", "add") in listed and exposed("a", "add") not in listed, listed
        assert reply.result["ttlMs"] == 0  # a partial answer
        assert "detail=partial" in reply.cache_status, reply.cache_status
