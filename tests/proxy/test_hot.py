"""The served proxy (HotProxy, gateway.proxy.hot) answers byte for byte as the plain Proxy does.

Two gateways, one on each, share a fake clock and sit in front of one deterministic upstream;
every generated sequence of requests goes to both in the same order, so their caches hold the
same entries, and every answer must agree in status, headers (but ``Date``) and body, and every
request record (but its times). The lean response a hit is answered with is held to what
``web.Response`` builds. Without ``[auth]`` the hot proxy answers most hits in one step
(``HotProxy.lean_hit``): the tests count those, so that the comparison is not of the plain
path with itself.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from gateway.app import PROXY, create_app
from gateway.config import parse_config
from gateway.proxy import HotProxy, Proxy
from gateway.proxy import hot as hot_module
from gateway.proxy.hot import LEAN_RESPONSES, PIECES_WRITES, LeanPiecesResponse, LeanResponse
from gateway.telemetry import RequestRecord

from ..support import ACCEPT, FakeClock, FakeUpstream, StartUpstream, V, rpc
from ..support.polling import wait_until

TOKEN = "t" * 24
READER = "r" * 24
#: Under a policy: the plain token sees "add" (tools) and no prompts; READER everything.
RULES = [{"name": "all", "tools": ["add"]}, {"name": "more", "scopes": ["s"], "tools": ["*"], "prompts": ["*"]}]
METHODS = ("tools/list", "prompts/list", "resources/list", "server/discover", "tools/call", "ping")


async def deterministic_upstream(request: web.Request, msg: dict[str, Any]) -> web.Response:
    """Answers from the request alone: public lists (a cursor ``private`` makes it private),
    a tool result for calls, an error for ``ping``."""
    method, params = msg.get("method"), msg.get("params") or {}
    if method == "ping":
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no"}})
    scope = "private" if params.get("cursor") == "private" else "public"
    result: dict[str, Any] = {"resultType": "complete", "echo": [method, params.get("cursor"), params.get("name")]}
    if method != "tools/call":
        result |= {"cacheScope": scope, "ttlMs": 30_000}
    if method in ("tools/list", "prompts/list"):  # items a policy may filter
        result[method.split("/")[0]] = [{"name": "add"}, {"name": "secret", "description": "é"}]
    return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def request_of(method: str, id_: object, cursor: str | None, caps: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if cursor is not None:
        params["cursor"] = cursor
    if method == "tools/call":
        params["name"] = "add"
    return rpc(method, id_, caps, **params)


requests = st.fixed_dictionaries(
    {
        "method": st.sampled_from(METHODS),
        "id": st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=8)),
        "cursor": st.sampled_from([None, "a", "b", "private"]),
        "caps": st.sampled_from([{}, {"elicitation": {}}]),
        "token": st.sampled_from([TOKEN, None, "wrong-token-of-24-chars!"]),
        # "{port}": the port of the gateway asked (the two listen on different ports).
        "origin": st.sampled_from(
            [None, "http://evil.example", "http://127.0.0.1:{port}", "http://localhost:{port}", "http://127.0.0.1:1"]
        ),
        "host": st.sampled_from([None, "localhost", "[::1]:{port}", "evil.example", "evil.example:8080"]),
        "header_method": st.sampled_from(["same", None, "tools/call"]),
        "advance_s": st.sampled_from([0.0, 0.0, 0.4, 12.0]),
        # compact: the text SDK clients send, whose id parse_request and the hot path find
        # (gateway.protocol.request_template); id_last: the same with the id last.
        "body": st.sampled_from(["json", "compact", "compact", "id_last", "garbage", "batch"]),
    }
)


def body_of(kind: str, msg: dict[str, Any]) -> str:
    """The text of ``msg`` as ``kind`` (see ``requests``)."""
    if kind == "compact":
        return json.dumps(msg, separators=(",", ":"))
    if kind == "id_last":
        rest = {k: v for k, v in msg.items() if k != "id"}
        return json.dumps({**rest, "id": msg["id"]}, separators=(",", ":"))
    return {"json": json.dumps(msg), "garbage": '{"jsonrpc":', "batch": json.dumps([msg])}[kind]


def timeless(record: RequestRecord) -> RequestRecord:
    """``record`` without its times (which differ between any two requests)."""
    upstream_seconds = None if record.upstream_seconds is None else 0.0
    return record._replace(seconds=0.0, ended=0.0, upstream_seconds=upstream_seconds)


class Pair:
    """The same gateway twice: on HotProxy and on the plain Proxy, with the request records of
    each (``records``) and how many answers the hot one made in one step (``lean``)."""

    def __init__(self, hot: TestClient[Any, Any], plain: TestClient[Any, Any], clock: FakeClock) -> None:
        self.hot, self.plain, self.clock = hot, plain, clock
        self.records: tuple[list[RequestRecord], list[RequestRecord]] = ([], [])
        self.upstream: FakeUpstream | None = None
        self.compared = 0  # the records compared so far
        self.lean = 0
        for client, records in zip((hot, plain), self.records, strict=True):
            journal = client.server.app[PROXY].pipeline.journal
            journal.add = lambda record, add=journal.add, records=records: (records.append(record), add(record))[1]
        proxy = hot.server.app[PROXY]
        assert isinstance(proxy, HotProxy)
        lean_hit = proxy.lean_hit

        def counted(*args: Any) -> LeanResponse | None:
            response = lean_hit(*args)
            self.lean += response is not None
            return response

        proxy.lean_hit = counted  # type: ignore[method-assign]

    async def send(self, case: dict[str, Any]) -> None:
        self.clock.advance(case["advance_s"])
        msg = request_of(case["method"], case["id"], case["cursor"], case["caps"])
        body = body_of(case["body"], msg)
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        headers["MCP-Protocol-Version"] = V
        if case["header_method"] is not None:
            headers["Mcp-Method"] = case["method"] if case["header_method"] == "same" else case["header_method"]
        if case["method"] == "tools/call":
            headers["Mcp-Name"] = "add"
        if case["token"] is not None:
            headers["Authorization"] = f"Bearer {case['token']}"
        answers = []
        for client in (self.hot, self.plain):
            own = {"port": str(client.server.port)}
            for header in ("origin", "host"):
                if case[header] is not None:
                    headers[header.capitalize()] = case[header].format_map(own)
            async with client.post("/servers/up/mcp", data=body.encode(), headers=headers) as resp:
                kept = [(k, v) for k, v in resp.headers.items() if k.lower() != "date"]
                answers.append((resp.status, kept, await resp.read()))
        assert answers[0] == answers[1], case
        hot, plain = ([timeless(record) for record in records[self.compared :]] for records in self.records)
        assert hot == plain, case
        self.compared = len(self.records[0])


AUTH = {"tokens": [TOKEN], "static": [{"token": READER, "subject": "reader", "scopes": ["s"]}]}


async def start_pair(
    aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream, *, auth: bool = True, **more: Any
) -> Pair:
    up = await start_upstream(deterministic_upstream)
    config = parse_config(
        {
            **({"auth": AUTH} if auth else {}),
            "registry": {"enabled": False},
            "upstreams": {"up": {"url": up.url}},
            **more,
        },
        env={},
    )
    clock = FakeClock()
    hot = await aiohttp_client(await aiohttp_server(create_app(config, clock=clock)))
    plain = await aiohttp_client(await aiohttp_server(create_app(config, clock=clock, hot_path=False)))
    pair = Pair(hot, plain, clock)
    pair.upstream = up
    return pair


@pytest.fixture
async def pair(aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream) -> Pair:
    return await start_pair(aiohttp_server, aiohttp_client, start_upstream)


@pytest.fixture
async def policy_pair(aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream) -> Pair:
    return await start_pair(aiohttp_server, aiohttp_client, start_upstream, policy={"rules": RULES})


@pytest.fixture
async def open_pair(aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream) -> Pair:
    """Without [auth]: the hot proxy answers hits in one step (lean_hit)."""
    return await start_pair(aiohttp_server, aiohttp_client, start_upstream, auth=False)


def test_the_app_serves_the_hot_proxy_and_the_plain_one_on_request() -> None:
    config = parse_config({"upstreams": {"up": {"url": "http://127.0.0.1:9/mcp"}}}, env={})
    assert type(create_app(config)[PROXY]) is HotProxy
    assert type(create_app(config, hot_path=False)[PROXY]) is Proxy
    assert LEAN_RESPONSES  # on this aiohttp the hot path really answers with LeanResponse


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases=st.lists(requests, min_size=1, max_size=8))
async def test_hot_and_plain_paths_answer_byte_for_byte_alike(pair: Pair, cases: list[dict[str, Any]]) -> None:
    for case in cases:
        await pair.send(case)


def test_cache_hits_are_answered_with_the_lean_response_on_this_aiohttp() -> None:
    """LeanResponse must build what web.Response builds; if an aiohttp release changed
    that, hits would fall back to web.Response: this test says so first."""
    headers = CIMultiDict({"Content-Type": "application/json", "Cache-Status": "mcp-gateway; hit; ttl=5"})
    assert LEAN_RESPONSES
    lean = LeanResponse(b'{"a":1}', headers.copy())
    assert vars(lean) == vars(web.Response(body=b'{"a":1}', headers=headers))
    assert isinstance(lean, web.Response) and lean.status == 200 and lean.body == b'{"a":1}'


@pytest.mark.parametrize("writer", ["as expected", "not as expected"])
async def test_a_lean_pieces_response_sends_what_web_response_sends_for_the_joined_pieces(
    aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    """The head and the pieces in one join, or (a writer in another state) the pieces joined
    and sent as web.Response sends a body: the same bytes either way."""
    pieces = (b'{"jsonrpc":"2.0","id":', b"7", memoryview(b'x,"result":{"ttlMs":')[1:], b"5", b"}}")
    headers = CIMultiDict({"Content-Type": "application/json", "Cache-Status": "mcp-gateway; hit; ttl=0"})
    if writer == "not as expected":
        monkeypatch.setattr(hot_module, "StreamWriter", type("Other", (), {}))

    async def lean(request: web.Request) -> web.StreamResponse:
        return LeanPiecesResponse(pieces, sum(map(len, pieces)), headers.copy())

    async def plain(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"".join(pieces), headers=headers.copy())

    app = web.Application()
    app.router.add_get("/lean", lean)
    app.router.add_get("/plain", plain)
    client = await aiohttp_client(app)
    answers = []
    for path in ("/lean", "/plain", "/lean"):  # kept alive between them
        async with client.get(path) as resp:
            answers.append((resp.status, [(k, v) for k, v in resp.headers.items() if k != "Date"], await resp.read()))
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][2] == b'{"jsonrpc":"2.0","id":7,"result":{"ttlMs":5}}'


async def test_the_one_step_hit_sends_its_head_and_pieces_in_one_join(
    open_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-step hit really sends its pieces (not a joined body) on this aiohttp."""
    assert PIECES_WRITES
    joins: list[int] = []
    writelines = hot_module.StreamWriter._writelines

    def counted(self: Any, chunks: Any) -> None:
        chunks = tuple(chunks)
        joins.append(len(chunks))
        writelines(self, chunks)

    monkeypatch.setattr(hot_module.StreamWriter, "_writelines", counted)
    base = {"id": 1, "cursor": None, "caps": {}, "token": None, "origin": None, "host": None}
    case = {**base, "method": "tools/list", "header_method": "same", "advance_s": 0.0, "body": "compact"}
    for id_ in (1, 2, 3):
        await open_pair.send({**case, "id": id_})
    assert open_pair.lean == 2
    # the head and five pieces (start, id, head, ttlMs, tail), once per lean hit
    assert joins.count(6) == 2


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases=st.lists(st.tuples(requests, st.sampled_from([TOKEN, READER])), min_size=1, max_size=8))
async def test_hot_and_plain_paths_answer_filtered_lists_byte_for_byte_alike(
    policy_pair: Pair, cases: list[tuple[dict[str, Any], str]]
) -> None:
    for case, token in cases:
        await policy_pair.send({**case, "token": token})


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases=st.lists(requests, min_size=1, max_size=8))
async def test_hot_and_plain_paths_answer_and_record_alike_without_auth(
    open_pair: Pair, cases: list[dict[str, Any]]
) -> None:
    for case in cases:
        await open_pair.send(case)


async def test_without_auth_a_repeated_request_is_a_lean_hit_with_the_plain_answer_and_record(open_pair: Pair) -> None:
    """The one-step answer is taken (else the comparison above would hold trivially), for the
    id first and last, and a request of another template is still keyed as its own."""
    base = {"id": 1, "cursor": None, "caps": {}, "token": None, "origin": None, "host": None}
    case = {**base, "method": "tools/list", "header_method": "same", "advance_s": 0.0, "body": "compact"}
    await open_pair.send(case)  # the miss, then hits under new ids
    for id_, body in ((2, "compact"), (31, "compact"), (4, "id_last"), (5, "id_last")):
        await open_pair.send({**case, "id": id_, "body": body})
    await open_pair.send({**case, "id": 6, "cursor": "a"})  # another key: a miss, then a hit
    await open_pair.send({**case, "id": 7, "cursor": "a"})
    assert open_pair.lean == 5
    lookups = [record.lookup for record in open_pair.records[0]]
    assert lookups == ["miss", "hit", "hit", "hit", "hit", "miss", "hit"]


async def test_a_remembered_template_is_no_way_around_the_body_limit_or_expiry(
    aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream
) -> None:
    pair = await start_pair(
        aiohttp_server, aiohttp_client, start_upstream, auth=False, listener={"max_body_bytes": 200}
    )
    base = {"id": 1, "cursor": None, "caps": {}, "token": None, "origin": None, "host": None}
    case = {**base, "method": "tools/list", "header_method": "same", "advance_s": 0.0, "body": "compact"}
    await pair.send(case)
    await pair.send({**case, "id": 2})
    await pair.send({**case, "id": 3, "cursor": "x" * 200})  # over the limit: 413 from both
    await pair.send({**case, "id": 4, "advance_s": 31.0})  # expired: a miss
    await pair.send({**case, "id": 5})
    assert [(r.status, r.lookup) for r in pair.records[0]] == [
        (200, "miss"),
        (200, "hit"),
        (413, None),
        (200, "miss"),
        (200, "hit"),
    ]
    assert pair.lean == 2


async def test_a_hit_due_for_refresh_ahead_is_left_to_the_pipeline_which_starts_the_refresh(
    aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream
) -> None:
    pair = await start_pair(aiohttp_server, aiohttp_client, start_upstream, auth=False, cache={"refresh_ahead": True})
    base = {"id": 1, "cursor": None, "caps": {}, "token": None, "origin": None, "host": None}
    case = {**base, "method": "tools/list", "header_method": "same", "advance_s": 0.0, "body": "compact"}
    await pair.send(case)
    await pair.send({**case, "id": 2, "advance_s": 27.0})  # in the last tenth of its 30 s
    assert [r.lookup for r in pair.records[0]] == ["miss", "hit"]
    assert pair.lean == 0
    assert pair.upstream is not None
    # a miss from each gateway, then a refresh from each
    await wait_until(lambda: len(pair.upstream.requests) == 4, what="both refreshes")  # type: ignore[union-attr]


async def test_a_failure_of_the_one_step_hit_is_answered_by_the_pipeline_and_logged_once(
    open_pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> LeanResponse | None:
        raise RuntimeError("a bug")

    open_pair.hot.server.app[PROXY].lean_hit = broken
    base = {"id": 1, "cursor": None, "caps": {}, "token": None, "origin": None, "host": None}
    case = {**base, "method": "tools/list", "header_method": "same", "advance_s": 0.0, "body": "compact"}
    with caplog.at_level("DEBUG", logger="mcp_gateway.proxy"):
        for id_ in (1, 2, 3):
            await open_pair.send({**case, "id": id_})  # the same answers and records as the plain path
    failures = [r for r in caplog.records if r.getMessage() == "hot path failed"]
    levels = [r.levelname for r in failures]  # (a body not yet arrived goes to the pipeline at once)
    assert len(levels) >= 2 and levels == ["ERROR"] + ["DEBUG"] * (len(levels) - 1)
    assert [r.lookup for r in open_pair.records[0]] == ["miss", "hit", "hit"]
