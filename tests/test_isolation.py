"""Isolation properties of the gateway: who may see which answer, and which upstream sees which credential.

* Answers an upstream marks ``cacheScope:"private"`` never reach another caller, whatever the
  interleaving of callers, upstream delays, SSE or JSON answers, and callers that give up half way
  (hypothesis over random sets of concurrent callers; MCP caching utility, ``cacheScope``).
* A ``public`` answer is shared: one upstream request for any number of concurrent callers.
* Entries of one upstream never answer a request to another, even when both names
  point at the same URL and differ only in their configured headers.
* A caller's ``Authorization`` never reaches an upstream that is not configured to receive it, on
  any path: forwarded POSTs, SSE answers, notifications, legacy GET/DELETE, listen streams
  (MCP Security Best Practices, "Token Passthrough"), checked at scripted upstreams and at real SDK ones.

The scripted upstreams are tests/support's ``FakeUpstream`` answering with :func:`echo_identity`:
the caller's identity (its ``Authorization``, or its ``clientCapabilities``) inside the result, so
a leak shows up as a foreign identity in an answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import STORE, create_app
from gateway.config import parse_config

from .support import (
    ACCEPT,
    CLIENT_CAPABILITIES_KEY,
    LEGACY_V,
    FakeUpstream,
    Handler,
    StartGateway,
    StartUpstream,
    mcp_headers,
    rpc,
    sse_frame,
    sse_messages,
)
from .support.fleet import Upstream, add_tool, fetch_requests, reset_counts

GATEWAY_TOKEN = "gateway-token-0123456789"
#: ``_meta`` keys the scripted upstream reads to shape its answer (``_meta`` is not part of the cache key).
DELAY_KEY = "com.example.test/delayMs"
MODE_KEY = "com.example.test/mode"
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")

pytestmark = pytest.mark.timeout(90)

PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- reading answers--------------------------------------------------------------------------------------


def final_message(content_type: str, raw: bytes) -> dict[str, Any]:
    """The JSON-RPC response in a JSON or SSE answer (the last message with a result or an error)."""
    if content_type.startswith("text/event-stream"):
        responses = [m for m in sse_messages(raw) if "result" in m or "error" in m]
        assert responses, f"no JSON-RPC response in {raw!r}"
        return responses[-1]
    msg = json.loads(raw)
    assert isinstance(msg, dict)
    return msg


# -- scripted upstreams that echo the caller's identity -----------------------------------------------------


def identity_of(request: web.Request, msg: dict[str, Any]) -> str:
    """Who the upstream thinks is asking: the Authorization it saw, else the clientCapabilities."""
    auth = request.headers.get("Authorization")
    if auth is not None:
        return f"auth:{auth}"
    meta = msg.get("params", {}).get("_meta", {})
    return "caps:" + json.dumps(meta.get(CLIENT_CAPABILITIES_KEY), sort_keys=True)


def echo_identity(name: str, scopes: dict[str, str]) -> Handler:
    """An upstream answer that puts the caller's identity inside every cacheable list's result.

    ``scopes`` maps a method to the ``cacheScope`` of its answers (else private). Each request may
    ask, in ``_meta``, for a delay (``DELAY_KEY``, ms) and an SSE answer (``MODE_KEY: "sse"``).
    A GET or DELETE gets 405, a notification 202.
    """

    async def echo(request: web.Request, msg: Any) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405, headers={"Allow": "POST"})
        if "id" not in msg:
            return web.Response(status=202)
        meta = msg.get("params", {}).get("_meta", {})
        await asyncio.sleep(meta.get(DELAY_KEY, 0) / 1000)
        method = msg["method"]
        if method == "subscriptions/listen":
            return await listen(request, msg)
        result: dict[str, Any] = {
            "identity": identity_of(request, msg),
            "upstream": name,
            "tools": [],
            "resultType": "complete",
            "cacheScope": scopes.get(method, "private"),
            "ttlMs": 60_000,
        }
        answer = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        if meta.get(MODE_KEY) != "sse":
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}
        await resp.write(sse_frame(progress))
        await resp.write(sse_frame(answer))
        return resp

    return echo


async def listen(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
    """A listen stream: the acknowledgement, then at once the final response."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    ack = {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": msg["id"]}, "notifications": {}},
    }
    await resp.write(sse_frame(ack))
    done = {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete"}}
    await resp.write(sse_frame(done))
    return resp


@dataclass
class Env:
    """A gateway in front of scripted upstreams, and a client for it."""

    client: TestClient[Any, Any]
    app: web.Application
    upstreams: dict[str, FakeUpstream] = field(default_factory=dict)

    async def post(
        self, msg: dict[str, Any], *, name: str = "up", headers: dict[str, str] | None = None
    ) -> tuple[int, str, bytes, str]:
        """POST ``msg`` to upstream ``name``; returns (status, content type, body, Cache-Status)."""
        hdrs = headers if headers is not None else mcp_headers(msg["method"])
        async with self.client.post(f"/servers/{name}/mcp", data=orjson.dumps(msg), headers=hdrs) as resp:
            raw = await resp.read()
            return resp.status, resp.headers.get("Content-Type", ""), raw, resp.headers.get("Cache-Status", "")


MakeEnv = Callable[..., Awaitable[Env]]


@pytest.fixture
async def make_env(aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream) -> MakeEnv:
    """``await make_env({"up": (scopes, upstream_opts)}, **gateway_config)``: one scripted upstream per
    name; several names may share one upstream with ``(..., {"same_as": "other"})``."""

    async def make(upstreams: dict[str, tuple[dict[str, str], dict[str, Any]]] | None = None, **config: Any) -> Env:
        upstreams = upstreams if upstreams is not None else {"up": ({}, {})}
        scripted: dict[str, FakeUpstream] = {}
        cfg_ups: dict[str, Any] = {}
        for name, (scopes, opts) in upstreams.items():
            opts = dict(opts)
            same_as = opts.pop("same_as", None)
            if same_as is not None:
                scripted[name] = scripted[same_as]
            else:
                scripted[name] = await start_upstream(echo_identity(name, scopes))
            cfg_ups[name] = {"url": scripted[name].url, **opts}
        # Registry probes are off unless a test asks: these tests count what the upstreams see.
        app = create_app(parse_config({"registry": {"enabled": False}, "upstreams": cfg_ups, **config}, env={}))
        client = await aiohttp_client(await aiohttp_server(app))
        return Env(client, app, scripted)

    return make


def stored_entries(env: Env, marker: str) -> int:
    """Cache entries whose key params contain ``marker`` (each example uses its own cursor)."""
    return sum(1 for key in env.app[STORE].keys() if marker.encode() in key.params)


# -- 1. private answers stay with their caller; public answers are shared ------------------------------------


@dataclass(frozen=True)
class Caller:
    who: int  # index of the caller's credential (Authorization token or clientCapabilities)
    method: str  # tools/list (private answers) or prompts/list (public answers)
    upstream_delay_ms: int
    start_delay_ms: int
    sse: bool
    gives_up_after_ms: int | None  # the caller disconnects after this long (None: waits for the answer)


callers_strategy = st.lists(
    st.builds(
        Caller,
        who=st.integers(0, 4),
        method=st.sampled_from(["tools/list", "prompts/list"]),
        upstream_delay_ms=st.integers(0, 25),
        start_delay_ms=st.integers(0, 25),
        sse=st.booleans(),
        gives_up_after_ms=st.none() | st.integers(1, 15),
    ),
    min_size=1,
    max_size=10,
)


def credential(identity: str, who: int) -> tuple[dict[str, str], dict[str, Any]]:
    """(extra headers, clientCapabilities) that make caller ``who`` distinct."""
    if identity == "authorization":
        return {"Authorization": f"Bearer caller-{who}"}, {}
    return {}, {"experimental": {"com.example/who": who}}


def expected_identity(identity: str, who: int) -> str:
    if identity == "authorization":
        return f"auth:Bearer caller-{who}"
    return "caps:" + json.dumps({"experimental": {"com.example/who": who}}, sort_keys=True)


@pytest.fixture(params=["authorization", "capabilities"])
async def echo_env(request: pytest.FixtureRequest, make_env: MakeEnv) -> tuple[str, Env]:
    """tools/list answers private, prompts/list public. Callers differ by Authorization (forwarded
    to this upstream) or by clientCapabilities (with the cache not varying on them, so every caller
    shares one key and concurrent misses coalesce)."""
    identity: str = request.param
    opts: dict[str, Any] = (
        {"forward_authorization": True} if identity == "authorization" else {"vary_on_client_capabilities": False}
    )
    scopes = {"tools/list": "private", "prompts/list": "public"}
    return identity, await make_env({"up": (scopes, opts)})


@PROPERTY_SETTINGS
@given(callers=callers_strategy)
async def test_private_answers_never_reach_another_caller_and_public_answers_are_shared(
    echo_env: tuple[str, Env], callers: list[Caller]
) -> None:
    identity, env = echo_env
    cursor = uuid.uuid4().hex  # a fresh cache key for every example
    upstream = env.upstreams["up"]

    async def call(i: int, c: Caller) -> tuple[Caller, int, dict[str, Any] | None]:
        headers, caps = credential(identity, c.who)
        meta = {DELAY_KEY: c.upstream_delay_ms, MODE_KEY: "sse" if c.sse else "json"}
        msg = rpc(c.method, id_=f"call-{i}", caps=caps, meta=meta, cursor=cursor)
        await asyncio.sleep(c.start_delay_ms / 1000)
        give_up = None if c.gives_up_after_ms is None else c.gives_up_after_ms / 1000
        try:
            status, ctype, raw, _ = await asyncio.wait_for(
                env.post(msg, headers={**mcp_headers(c.method), **headers}), timeout=give_up or 10
            )
        except TimeoutError:
            assert give_up is not None, "a caller that waits got no answer within 10 s"
            return c, 0, None
        return c, status, final_message(ctype, raw)

    outcomes = await asyncio.gather(*(call(i, c) for i, c in enumerate(callers)))

    public_results: list[dict[str, Any]] = []
    by_context: dict[int, list[dict[str, Any]]] = {}
    for i, (c, status, msg) in enumerate(outcomes):
        if msg is None:
            continue
        assert status == 200, msg
        assert msg["id"] == f"call-{i}"
        result = msg["result"]
        if c.method == "tools/list":
            assert result["cacheScope"] == "private"
            assert result["identity"] == expected_identity(identity, c.who), "a private answer reached another caller"
        else:
            assert result["cacheScope"] == "public"
            public_results.append({k: v for k, v in result.items() if k != "ttlMs"})
            by_context.setdefault(c.who if identity == "authorization" else 0, []).append(public_results[-1])

    # Private answers are never stored. The public answer is stored once per authorization context:
    # once in all where the upstream does not see credentials; once per caller credential where it
    # does (forward_authorization), since it authenticates each request itself.
    assert not any(k.method == "tools/list" for k in env.app[STORE].keys())
    public_callers = [c for c in callers if c.method == "prompts/list"]
    contexts = {c.who for c in public_callers} if identity == "authorization" else {0}
    if public_results:
        assert 1 <= stored_entries(env, cursor) <= len(contexts)
    if public_callers and all(c.gives_up_after_ms is None for c in public_callers):
        # Nobody gave up: one upstream request per context served every public caller of it.
        assert stored_entries(env, cursor) == len(contexts)
        assert upstream.count("prompts/list", cursor) == len(contexts)
        assert all(r == same[0] for same in by_context.values() for r in same)


async def test_followers_of_a_private_leader_each_get_their_own_answer(make_env: MakeEnv) -> None:
    env = await make_env({"up": ({"tools/list": "private"}, {"forward_authorization": True})})
    cursor = uuid.uuid4().hex

    async def call(who: int, delay_ms: int) -> dict[str, Any]:
        msg = rpc("tools/list", id_=who, meta={DELAY_KEY: delay_ms}, cursor=cursor)
        status, ctype, raw, _ = await env.post(msg, headers=mcp_headers("tools/list", Authorization=f"Bearer t{who}"))
        assert status == 200
        return final_message(ctype, raw)

    # The first caller leads (slow upstream); the others arrive while it is in flight.
    answers = await asyncio.gather(*(call(who, 50 if who == 0 else 0) for who in range(8)))
    assert [a["result"]["identity"] for a in answers] == [f"auth:Bearer t{who}" for who in range(8)]
    assert env.upstreams["up"].count("tools/list") == 8
    assert len(env.app[STORE]) == 0


async def test_private_answer_is_not_served_to_the_same_key_with_other_capabilities(make_env: MakeEnv) -> None:
    env = await make_env({"up": ({"tools/list": "private"}, {})})
    for who in (1, 2, 1):
        msg = rpc("tools/list", id_=who, caps={"experimental": {"com.example/who": who}})
        status, ctype, raw, cache_status = await env.post(msg)
        assert status == 200 and "hit" not in cache_status
        assert final_message(ctype, raw)["result"]["identity"] == expected_identity("capabilities", who)


# -- 2. one upstream's entries never answer another -------------------------------------------------------------


@pytest.fixture
async def twin_env(make_env: MakeEnv) -> Env:
    """Upstreams a and b are separate servers; c and d are one server reached under two names that
    differ only in a configured header, and which answers differently per header."""
    public = {"tools/list": "public", "prompts/list": "public"}
    return await make_env(
        {
            "a": (public, {}),
            "b": (public, {}),
            "c": (public, {"headers": {"Authorization": "Bearer tenant-c"}}),
            "d": (public, {"same_as": "c", "headers": {"Authorization": "Bearer tenant-d"}}),
        }
    )


@PROPERTY_SETTINGS
@given(
    plan=st.lists(
        st.tuples(st.sampled_from("abcd"), st.sampled_from(["tools/list", "prompts/list"]), st.integers(0, 10)),
        min_size=1,
        max_size=12,
    )
)
async def test_entries_of_one_upstream_never_answer_a_request_to_another(
    twin_env: Env, plan: list[tuple[str, str, int]]
) -> None:
    cursor = uuid.uuid4().hex
    expected = {"a": "a", "b": "b", "c": "c", "d": "c"}  # the name of the scripted server behind each route
    expected_identity_of = {"c": "auth:Bearer tenant-c", "d": "auth:Bearer tenant-d"}

    async def call(i: int, name: str, method: str, start_ms: int) -> None:
        await asyncio.sleep(start_ms / 1000)
        msg = rpc(method, id_=i, meta={DELAY_KEY: 5}, cursor=cursor)
        status, ctype, raw, _ = await twin_env.post(msg, name=name)
        assert status == 200
        result = final_message(ctype, raw)["result"]
        assert result["upstream"] == expected[name]
        if name in expected_identity_of:
            assert result["identity"] == expected_identity_of[name], f"/servers/{name} got another route's entry"

    await asyncio.gather(*(call(i, *step) for i, step in enumerate(plan)))
    # Exactly one upstream request per (route, method) used, whatever the interleaving.
    for name in "abcd":
        for method in ("tools/list", "prompts/list"):
            used = any(n == name and m == method for n, m, _ in plan)
            server = twin_env.upstreams[name]
            sent = sum(
                1
                for r in server.requests
                if cursor.encode() in r.body
                and r.method == method
                and (name not in expected_identity_of or r.headers.get("Authorization") == f"Bearer tenant-{name}")
            )
            assert sent == (1 if used else 0), (name, method)


# -- 3. a caller's Authorization reaches only upstreams configured to receive it ------------------------------------

CALLER_AUTH = "Bearer caller-secret-token"


async def every_path(env: Env, name: str, extra: dict[str, str]) -> None:
    """Send one request of every kind the gateway forwards to upstream ``name``."""
    list_msg = rpc("tools/list", id_=1, cursor="every-path")
    for _ in range(2):  # a miss, then a hit
        assert (await env.post(list_msg, name=name, headers={**mcp_headers("tools/list"), **extra}))[0] == 200
    sse_msg = rpc("prompts/list", id_=2, meta={MODE_KEY: "sse"})
    assert (await env.post(sse_msg, name=name, headers={**mcp_headers("prompts/list"), **extra}))[0] == 200
    call = rpc("tools/call", id_=3, name="x")
    assert (await env.post(call, name=name, headers={**mcp_headers("tools/call", "x"), **extra}))[0] == 200
    listen = rpc("subscriptions/listen", id_=4, notifications={"toolsListChanged": True})
    assert (await env.post(listen, name=name, headers={**mcp_headers("subscriptions/listen"), **extra}))[0] == 200
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}
    async with env.client.post(
        f"/servers/{name}/mcp", data=orjson.dumps(note), headers={**mcp_headers("notifications/cancelled"), **extra}
    ) as resp:
        assert resp.status == 202
    legacy = {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {"protocolVersion": LEGACY_V}}
    legacy_headers = {"Content-Type": "application/json", "Accept": ACCEPT, "Mcp-Session-Id": "s-1", **extra}
    async with env.client.post(f"/servers/{name}/mcp", data=orjson.dumps(legacy), headers=legacy_headers) as resp:
        assert resp.status == 200
    for http_method in ("GET", "DELETE"):
        async with env.client.request(http_method, f"/servers/{name}/mcp", headers=legacy_headers) as resp:
            assert resp.status == 405


def credentials_seen(upstream: FakeUpstream) -> list[tuple[str, str]]:
    return [(k, v) for r in upstream.requests for k, v in r.headers.items() if k.lower() in CREDENTIAL_HEADERS]


async def test_caller_authorization_reaches_only_upstreams_configured_to_receive_it_on_every_path(
    make_env: MakeEnv,
) -> None:
    scopes = {"tools/list": "public", "prompts/list": "public"}
    env = await make_env({"closed": (scopes, {}), "open": (scopes, {"forward_authorization": True})})
    extra = {"Authorization": CALLER_AUTH, "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0", "Cookie": "sid=secret"}
    await every_path(env, "closed", extra)
    await every_path(env, "open", extra)

    closed, opened = env.upstreams["closed"], env.upstreams["open"]
    assert len(closed.requests) == len(opened.requests) == 8  # every kind reached the upstream (the hit did not)
    assert credentials_seen(closed) == []
    # The positive control: the same traffic carries the caller's token where it is configured.
    assert {v for k, v in credentials_seen(opened) if k.lower() == "authorization"} == {CALLER_AUTH}
    assert all(r.headers.get("Authorization") == CALLER_AUTH for r in opened.requests)
    assert not any(k.lower() in ("proxy-authorization", "cookie") for k, _ in credentials_seen(opened))


async def test_gateway_token_never_reaches_any_upstream_on_any_path(make_env: MakeEnv) -> None:
    scopes = {"tools/list": "public", "prompts/list": "public"}
    env = await make_env(
        {"a": (scopes, {}), "b": (scopes, {"headers": {"X-Upstream-Key": "k"}})}, auth={"tokens": [GATEWAY_TOKEN]}
    )
    for name in ("a", "b"):
        await every_path(env, name, {"Authorization": f"Bearer {GATEWAY_TOKEN}"})
    for name in ("a", "b"):
        assert len(env.upstreams[name].requests) == 8
        assert credentials_seen(env.upstreams[name]) == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["list", "call", "sse", "notification", "legacy", "GET", "DELETE", "invalid"]),
    spellings=st.lists(
        st.sampled_from(["Authorization", "authorization", "AUTHORIZATION", "aUtHoRiZaTiOn"]), min_size=1, max_size=3
    ),
    value=st.sampled_from([CALLER_AUTH, "Basic dXNlcjpwYXNz", "Bearer ", "token-without-scheme"]),
)
async def test_authorization_in_any_spelling_never_reaches_a_closed_upstream(
    closed_env: Env, kind: str, spellings: list[str], value: str
) -> None:
    upstream = closed_env.upstreams["closed"]
    before = len(upstream.requests)
    auth = [(spelling, f"{value}-{i}") for i, spelling in enumerate(spellings)]
    url = "/servers/closed/mcp"
    base = [("Content-Type", "application/json"), ("Accept", ACCEPT)]
    cursor = uuid.uuid4().hex
    if kind in ("GET", "DELETE"):
        async with closed_env.client.request(kind, url, headers=[*base, ("Mcp-Session-Id", "s"), *auth]) as resp:
            assert resp.status == 405
    else:
        msg: dict[str, Any] = {
            "list": rpc("tools/list", cursor=cursor),
            "call": rpc("tools/call", name="x"),
            "sse": rpc("prompts/list", meta={MODE_KEY: "sse"}, cursor=cursor),
            "notification": {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}},
            "legacy": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            "invalid": rpc("tools/list"),
        }[kind]
        method = msg["method"]
        headers = list(mcp_headers(method, "x" if kind == "call" else None).items())
        if kind == "legacy":
            headers = [*base, ("MCP-Protocol-Version", LEGACY_V)]
        if kind == "invalid":
            headers = [(k, "prompts/list" if k == "Mcp-Method" else v) for k, v in headers]
        async with closed_env.client.post(url, data=orjson.dumps(msg), headers=[*headers, *auth]) as resp:
            await resp.read()
            assert resp.status == (400 if kind == "invalid" else 202 if kind == "notification" else 200)
    assert len(upstream.requests) == before + (0 if kind == "invalid" else 1)
    assert credentials_seen(upstream) == []


@pytest.fixture
async def closed_env(make_env: MakeEnv) -> Env:
    return await make_env({"closed": ({"tools/list": "public", "prompts/list": "public"}, {})})


# -- 4. the same, against real SDK upstreams (raw request records at /_requests) --------------------------------------


def body(method: str, id_: object, **params: Any) -> bytes:
    return orjson.dumps(rpc(method, id_=id_, **params))


async def sdk_every_path(http: aiohttp.ClientSession, url: str, listen_url: str, auth: str) -> None:
    """One request of every kind, with the caller's Authorization, through the gateway to SDK upstreams."""
    a = {"Authorization": auth}
    for i in (1, 2):
        async with http.post(url, data=body("tools/list", i), headers=mcp_headers("tools/list", **a)) as resp:
            assert resp.status == 200
    call = body("tools/call", 3, name="add", arguments={"a": 1, "b": 2})
    async with http.post(url, data=call, headers=mcp_headers("tools/call", "add", **a)) as resp:
        assert resp.status == 200
    progress = body(
        "tools/call", 4, name="slow_progress", arguments={"steps": 2, "delay_ms": 1}, meta={"progressToken": "p"}
    )
    async with http.post(url, data=progress, headers=mcp_headers("tools/call", "slow_progress", **a)) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert b"notifications/progress" in await resp.read()
    note = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}})
    async with http.post(url, data=note, headers=mcp_headers("notifications/cancelled", **a)) as resp:
        assert resp.status < 500
    init = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "initialize",
            "params": {"protocolVersion": LEGACY_V, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }
    )
    legacy = {"Accept": ACCEPT, "Content-Type": "application/json", **a}
    async with http.post(url, data=init, headers=legacy) as resp:
        assert resp.status == 200
        session = resp.headers["Mcp-Session-Id"]
        await resp.read()
    legacy = {**legacy, "Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY_V}
    async with http.get(url, headers={**legacy, "Accept": "text/event-stream"}) as resp:
        if resp.status == 200:  # a legacy standing stream: leave it at once
            resp.close()
    async with http.delete(url, headers=legacy) as resp:
        assert resp.status < 500
    listen = body("subscriptions/listen", 6, notifications={"toolsListChanged": True})
    async with http.post(listen_url, data=listen, headers=mcp_headers("subscriptions/listen", **a)) as resp:
        assert resp.status == 200
        await asyncio.wait_for(read_until(resp, b"notifications/subscriptions/acknowledged"), 10)


async def read_until(resp: aiohttp.ClientResponse, marker: bytes) -> bytes:
    """Read a streamed body until ``marker`` has arrived."""
    seen = b""
    while marker not in seen:
        chunk = await resp.content.readany()
        assert chunk, f"stream ended before {marker!r}: {seen!r}"
        seen += chunk
    return seen


def record_credentials(records: list[Any]) -> list[tuple[str, str, str | None]]:
    return [
        (r.method, name, r.header("x-gateway-route"))
        for r in records
        for name, _ in r.headers
        if name in CREDENTIAL_HEADERS
    ]


async def test_sdk_upstreams_never_see_the_callers_authorization_on_any_path(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, changing_up: Upstream
) -> None:
    await reset_counts(public_up)
    await reset_counts(changing_up)
    closed = {"X-Gateway-Route": "closed"}
    gw = await start_gateway(
        {
            "upstreams": {
                "pub": {"url": public_up.url, "headers": closed},
                "chg": {"url": changing_up.url, "headers": closed},
                "pub-open": {
                    "url": public_up.url,
                    "forward_authorization": True,
                    "headers": {"X-Gateway-Route": "open"},
                },
            }
        }
    )
    await sdk_every_path(http, gw.url("pub"), gw.url("chg"), CALLER_AUTH)
    await sdk_every_path(http, gw.url("pub-open"), gw.url("chg"), CALLER_AUTH)

    records = await fetch_requests(public_up) + await fetch_requests(changing_up)
    routes = [r.header("x-gateway-route") for r in records]
    assert routes.count("closed") >= 8 and routes.count("open") >= 7  # every kind got there (a hit did not)
    assert {r.http_method for r in records} >= {"POST", "GET", "DELETE"}
    assert "subscriptions/listen" in {r.method for r in records}
    leaked = [c for c in record_credentials(records) if c[2] != "open"]
    assert leaked == []
    # The positive control: the configured route carries the caller's token on every request.
    opened = [r for r in records if r.header("x-gateway-route") == "open"]
    assert all(r.header("authorization") == CALLER_AUTH for r in opened)


async def test_sdk_private_answers_are_fetched_for_every_caller(
    start_gateway: StartGateway, http: aiohttp.ClientSession, private_up: Upstream
) -> None:
    await reset_counts(private_up)
    gw = await start_gateway({"upstreams": {"priv": {"url": private_up.url, "forward_authorization": True}}})

    async def call(i: int) -> str:
        headers = mcp_headers("tools/list", Authorization=f"Bearer caller-{i % 3}")
        async with http.post(gw.url("priv"), data=body("tools/list", i), headers=headers) as resp:
            assert resp.status == 200
            assert (await resp.json())["result"]["cacheScope"] == "private"
            return resp.headers["Cache-Status"]

    statuses = await asyncio.gather(*(call(i) for i in range(12)))
    assert not any("hit" in s for s in statuses)
    records = [r for r in await fetch_requests(private_up) if r.method == "tools/list"]
    assert len(records) == 12
    assert sorted(r.header("authorization") or "" for r in records) == sorted(
        f"Bearer caller-{i % 3}" for i in range(12)
    )


# -- 5. known gaps ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("concurrent", [False, True], ids=["after-store", "coalesced"])
async def test_public_entry_is_not_served_to_a_caller_the_upstream_would_refuse(
    aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream, concurrent: bool
) -> None:
    seen: list[str | None] = []

    async def guarded(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer valid-token":
            return web.Response(status=401, headers={"WWW-Authenticate": 'Bearer resource_metadata="https://x"'})
        await asyncio.sleep(0.05)
        result = {
            "tools": [{"name": "secret_admin_tool"}],
            "resultType": "complete",
            "cacheScope": "public",
            "ttlMs": 60_000,
        }
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    up = await start_upstream(guarded)
    cfg = {"registry": {"enabled": False}, "upstreams": {"up": {"url": up.url, "forward_authorization": True}}}
    client = await aiohttp_client(await aiohttp_server(create_app(parse_config(cfg, env={}))))

    async def post(auth: str | None) -> int:
        extra = {} if auth is None else {"Authorization": auth}
        async with client.post(
            "/servers/up/mcp", data=body("tools/list", 1), headers=mcp_headers("tools/list", **extra)
        ) as r:
            await r.read()
            return r.status

    if concurrent:
        # The valid caller leads; the others arrive while its request is in flight.
        leader = asyncio.ensure_future(post("Bearer valid-token"))
        while not seen:  # noqa: ASYNC110 - waiting for the upstream to see the leader
            await asyncio.sleep(0.005)
        statuses = [await leader, *await asyncio.gather(post(None), post("Bearer stolen-or-expired"))]
    else:
        statuses = [await post(a) for a in ("Bearer valid-token", None, "Bearer stolen-or-expired")]
    assert statuses == [200, 401, 401]


# -- 6. the gateway's own traffic (registry probes and listen streams) -----------------------------------------------


def own_traffic(record: Any) -> bool:
    """A request the gateway made by itself: its JSON-RPC id is one of the registry's."""
    try:
        msg = record.json()
    except ValueError:
        return False
    return isinstance(msg, dict) and str(msg.get("id", "")).startswith("mcp-gateway-")


async def test_registry_probes_and_listen_streams_never_carry_a_callers_authorization(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, changing_up: Upstream
) -> None:
    await reset_counts(public_up)
    await reset_counts(changing_up)
    own_credential = "Bearer gateway-own-credential"
    gw = await start_gateway(
        {
            "registry": {
                "probe_min_interval_s": 0.2,
                "probe_max_interval_s": 0.3,
                "backoff_base_s": 0.1,
                "backoff_max_s": 0.5,
            },
            "upstreams": {
                # Callers' tokens go to this upstream on their own requests, never on the gateway's.
                "chg": {"url": changing_up.url, "forward_authorization": True},
                # The gateway's own credential for this one: its probes carry that, and only that.
                "pub": {"url": public_up.url, "headers": {"Authorization": own_credential}},
            },
        }
    )

    async def caller_traffic(i: int) -> None:
        auth = {"Authorization": f"{CALLER_AUTH}-{i}"}
        for name in ("chg", "pub"):
            async with http.post(
                gw.url(name), data=body("tools/list", i), headers=mcp_headers("tools/list", **auth)
            ) as r:
                assert r.status == 200
            call = body("tools/call", i, name="add", arguments={"a": i, "b": 1})
            async with http.post(gw.url(name), data=call, headers=mcp_headers("tools/call", "add", **auth)) as r:
                assert r.status == 200

    own_chg: list[Any] = []
    own_pub: list[Any] = []
    for i in range(40):  # callers keep talking while the registry probes and listens (bounded: ~15 s)
        await caller_traffic(i)
        if i % 5 == 0:
            await add_tool(changing_up)  # a list_changed notification on the gateway's listen stream
        own_chg = [r for r in await fetch_requests(changing_up) if own_traffic(r)]
        own_pub = [r for r in await fetch_requests(public_up) if own_traffic(r)]
        probes = sum(r.method == "server/discover" for r in own_chg + own_pub)
        if i >= 3 and probes >= 4 and any(r.method == "subscriptions/listen" for r in own_chg):
            break
        await asyncio.sleep(0.3)

    assert {r.method for r in own_chg} >= {"server/discover", "subscriptions/listen"}
    assert {r.method for r in own_pub} >= {"server/discover"}
    for record in own_chg:
        assert [k for k, _ in record.headers if k in CREDENTIAL_HEADERS] == [], record.method
    for record in own_pub:
        assert [(k, v) for k, v in record.headers if k in CREDENTIAL_HEADERS] == [("authorization", own_credential)]
    # The positive control: the callers' own requests to chg did carry their tokens.
    callers_chg = [r for r in await fetch_requests(changing_up) if not own_traffic(r)]
    assert callers_chg and all((r.header("authorization") or "").startswith(CALLER_AUTH) for r in callers_chg)
