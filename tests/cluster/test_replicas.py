"""Many replicas, one gateway (docs/replicas.md).

Real gateway processes (``mcp-gateway serve``, :mod:`tests.support.replicas`) name one real
``redis-server`` (:mod:`tests.support.redis`, a fresh one per test) in ``[cluster]``, in front of
the real SDK upstreams of ``tests/servers/`` (conftest's ``public_up``, ``private_up`` and
``changing_up``, one process per module, their request counts reset by each test that counts).
Faults come from the real thing: Redis stopped, its pub/sub connections killed, garbage written
over its keys, a replica SIGKILLed. Waits poll with deadlines; the one fixed pause is the 1 s the
invalidation contract allows.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ..support.fleet import REPO_ROOT, Upstream, add_tool, fetch_counts, reset_counts
from ..support.redis import RedisServer
from ..support.replicas import Replicas, dump_toml
from ..support.wire import NAME_FIELD, mcp_headers, rpc, sse_messages
from .conftest import StartReplicas

pytestmark = pytest.mark.timeout(60)

KEY_PREFIX = "gw-cluster-test"
LIVE_META_KEY = "io.github.mcp-gateway/live"
UPSTREAM_TTL_MS = 60_000  # the tests/servers default
#: Probes every ~1 s and quick retries, so the lease holder's listen stream is up in about a second.
FAST_REGISTRY = {
    "probe_min_interval_s": 0.5,
    "probe_max_interval_s": 1.0,
    "probe_timeout_s": 3,
    "backoff_base_s": 0.1,
    "backoff_max_s": 0.5,
}
CALLER_TOKEN = "cluster-tests-caller-token-abcdefghij"
#: The cluster's promise: no replica answers from an entry later than this after its invalidation.
INVALIDATION_S = 1.0
#: ... and another replica holds a dead one's lease (its probes and listen streams) within this.
TAKEOVER_S = 20.0


def cluster_config(
    redis: RedisServer,
    upstreams: Mapping[str, Upstream],
    *,
    key_prefix: str = KEY_PREFIX,
    registry: Mapping[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """A replica's config: ``[cluster]`` on ``redis``, fast probes, one table per upstream."""
    return {
        "cluster": {"redis_url": redis.url, "key_prefix": key_prefix, "timeout_s": 0.25},
        "registry": {**FAST_REGISTRY, **(registry or {})},
        "upstreams": {name: {"url": up.url} for name, up in upstreams.items()},
        **more,
    }


# -- talking to the replicas ---------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    cache_status: str
    raw: bytes
    sent_id: object

    @property
    def params(self) -> list[str]:
        """The ``Cache-Status`` member's parts, e.g. ``["mcp-gateway", "hit", "ttl=59"]``."""
        return [part.strip() for part in self.cache_status.split(";")]

    @property
    def hit(self) -> bool:
        return self.params[0] == "mcp-gateway" and "hit" in self.params[1:]

    @property
    def shared(self) -> bool:
        """A hit the shared tier answered (``detail=shared``)."""
        return self.hit and "detail=shared" in self.params

    @property
    def stored(self) -> bool:
        return "stored" in self.params[1:]

    @property
    def ttl_s(self) -> int:
        values = [p.removeprefix("ttl=") for p in self.params if p.startswith("ttl=")]
        assert len(values) == 1, self.cache_status
        return int(values[0])

    @property
    def json(self) -> dict[str, Any]:
        text = self.raw.decode(errors="replace")
        if self.raw.lstrip().startswith(b"{"):
            return dict(json.loads(self.raw))
        responses = [m for m in sse_messages(self.raw) if "result" in m or "error" in m]
        assert responses, f"no JSON-RPC response in {text!r}"
        return dict(responses[-1])

    @property
    def result(self) -> dict[str, Any]:
        msg = self.json
        assert "result" in msg, f"expected a result, got {msg}"
        return dict(msg["result"])

    @property
    def ttl_ms(self) -> int:
        ttl = self.result["ttlMs"]
        assert isinstance(ttl, int), self.result
        return ttl

    def tool_names(self) -> set[str]:
        return {t["name"] for t in self.result["tools"]}


async def call(
    http: aiohttp.ClientSession,
    url: str,
    method: str = "tools/list",
    params: Mapping[str, Any] | None = None,
    *,
    id_: object = 1,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """One modern request; the answer as received."""
    params = dict(params or {})
    field = NAME_FIELD.get(method)
    name = params.get(field) if field is not None else None
    body = json.dumps(rpc(method, id_, **params)).encode()
    async with http.post(url, data=body, headers={**mcp_headers(method, name), **(headers or {})}) as resp:
        return Answer(resp.status, resp.headers.get("Cache-Status", ""), await resp.read(), id_)


def without_ttl(result: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "ttlMs"}


def assert_answered(answer: Answer, expected: Mapping[str, Any], what: str = "") -> None:
    """200, the caller's own id, and the upstream's result (``ttlMs`` positive and at most the upstream's)."""
    assert answer.status == 200, f"{what}: {answer.status} {answer.cache_status} {answer.raw[:300]!r}"
    msg = answer.json
    assert msg.get("id") == answer.sent_id, f"{what}: id {msg.get('id')!r}, sent {answer.sent_id!r}"
    assert "result" in msg, f"{what}: {msg}"
    assert without_ttl(msg["result"]) == without_ttl(expected), what
    if "ttlMs" in expected:
        assert 0 < msg["result"]["ttlMs"] <= expected["ttlMs"], what


async def eventually(
    condition: Callable[[], Awaitable[bool]],
    *,
    limit_s: float,
    what: str,
    every_s: float = 0.05,
    last: Callable[[], object] | None = None,
) -> float:
    """Poll ``condition`` until it is true; fail after ``limit_s``, with what ``last()`` says
    about the last try. Returns the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        if await condition():
            return loop.time() - started
        if loop.time() - started > limit_s:
            seen = f"; last seen: {last()}" if last is not None else ""
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}{seen}")
        await asyncio.sleep(every_s)


def lists_tool(
    replicas: Replicas, http: aiohttp.ClientSession, upstream: str, tool: str
) -> tuple[Callable[[], Awaitable[bool]], Callable[[], object]]:
    """A condition for :func:`eventually`: every running replica's ``tools/list`` names ``tool``;
    and what the last try saw (per replica: its Cache-Status, or that it lists the tool)."""
    seen: dict[int, str] = {}

    async def condition() -> bool:
        seen.clear()
        for i in replicas.indices():
            answer = await call(http, replicas.url(i, upstream))
            listed = answer.status == 200 and tool in answer.tool_names()
            seen[i] = "lists it" if listed else f"{answer.status} {answer.cache_status}"
        return all(v == "lists it" for v in seen.values())

    return condition, lambda: dict(seen)


async def metric_on(replicas: Replicas, index: int, name: str, **labels: str) -> float | None:
    """One sample of a replica, or None when it has none or does not answer."""
    try:
        return await replicas.metric(index, name, **labels)
    except (aiohttp.ClientError, TimeoutError, AssertionError):
        return None


async def cluster_up(replicas: Replicas, index: int) -> float | None:
    return await metric_on(replicas, index, "mcp_gateway_cluster_up")


async def all_cluster_up(replicas: Replicas, value: float) -> bool:
    return all([await cluster_up(replicas, i) == value for i in replicas.indices()])


async def lease_holders(replicas: Replicas, upstream: str) -> list[int]:
    """The running replicas whose ``mcp_gateway_cluster_leases_held{upstream}`` is 1."""
    running = replicas.indices()
    held = [await metric_on(replicas, i, "mcp_gateway_cluster_leases_held", upstream=upstream) for i in running]
    return [i for i, value in zip(running, held, strict=True) if value == 1]


async def live(replicas: Replicas, index: int, upstream: str) -> dict[str, Any]:
    """The live state of ``upstream`` in replica ``index``'s registry (``/v0.1/servers/.../latest``)."""
    status, body = await replicas.get(index, f"/v0.1/servers/{upstream}/versions/latest")
    assert status == 200, (status, body)
    return dict(body["_meta"][LIVE_META_KEY])


async def wait_for_listening_holder(replicas: Replicas, upstream: str, *, limit_s: float = 10.0) -> int:
    """The one replica holding ``upstream``'s lease, once its listen stream is acknowledged."""
    holder: list[int] = []

    async def one_holder_listening() -> bool:
        holders = await lease_holders(replicas, upstream)
        if len(holders) != 1:
            return False
        try:
            state = (await live(replicas, holders[0], upstream))["listen"]["state"]
        except (aiohttp.ClientError, TimeoutError, AssertionError):
            return False
        holder[:] = holders
        return bool(state == "acknowledged")

    await eventually(one_holder_listening, limit_s=limit_s, what=f"one replica holding {upstream}'s listen stream")
    return holder[0]


async def purge(
    http: aiohttp.ClientSession, replicas: Replicas, index: int, *, cluster: str | None = "done", **query: str
) -> int:
    """A purge on replica ``index``: its local count. ``cluster``: what the answer says of the
    cluster, ``"done"`` (200), ``"pending"`` (503) or nothing (``None``: no ``[cluster]``, 200)."""
    url = f"{replicas.base_url(index)}/admin/cache/purge"
    headers = {"Authorization": f"Bearer {replicas.admin_token}"}
    async with http.post(url, params=query, headers=headers) as resp:
        body = await resp.json()
        assert (resp.status, body.get("cluster")) == (503 if cluster == "pending" else 200, cluster), body
        purged = body["purged"]
    assert isinstance(purged, int)
    return purged


async def count(up: Upstream, method: str) -> int:
    return (await fetch_counts(up)).get(method, 0)


async def stored_in_redis(redis: RedisServer, needle: bytes, *, prefix: str = KEY_PREFIX) -> bool:
    """Whether some value under ``prefix`` holds ``needle`` (the write to the shared tier is done)."""
    blobs = await asyncio.to_thread(redis.blobs, f"{prefix}*")
    return any(needle in blob for blob in blobs)


def unique(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        yield session


@pytest.fixture
async def fresh_http() -> AsyncIterator[aiohttp.ClientSession]:
    """A new connection per request: with ``--workers N``, each may reach another worker."""
    timeout = aiohttp.ClientTimeout(total=15)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


# -- one cache ---------------------------------------------------------------------------------------------


async def test_an_entry_stored_by_one_replica_is_a_hit_on_another_with_ttl_lowered_from_the_first_receipt(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"pub": public_up}))
    await reset_counts(public_up)
    first = await call(http, replicas.url(0, "pub"), id_="on-a")
    received = time.monotonic()
    assert first.status == 200 and first.stored, first.cache_status
    assert first.ttl_ms == UPSTREAM_TTL_MS
    # A writes it to Redis in the background, after answering: B's first read must find it.
    await eventually(lambda: stored_in_redis(redis_server, b"slow_progress"), limit_s=5, what="A's entry in Redis")
    await asyncio.sleep(0.3)  # so that "lowered from the first receipt" is visible in milliseconds

    on_b = await call(http, replicas.url(1, "pub"), id_="on-b")
    assert on_b.status == 200 and on_b.shared, on_b.cache_status  # "mcp-gateway; hit; ttl=N; detail=shared"
    assert on_b.json["id"] == "on-b"
    assert without_ttl(on_b.result) == without_ttl(first.result)
    elapsed_ms = (time.monotonic() - received) * 1000
    assert 0 < on_b.ttl_ms <= UPSTREAM_TTL_MS - 300, on_b.ttl_ms
    assert on_b.ttl_ms >= UPSTREAM_TTL_MS - elapsed_ms - 1000, (on_b.ttl_ms, elapsed_ms)
    assert 0 < on_b.ttl_s <= UPSTREAM_TTL_MS // 1000

    again = await call(http, replicas.url(1, "pub"), id_=3)
    assert again.hit and not again.shared, again.cache_status  # now from B's local tier
    assert again.json["id"] == 3
    assert again.ttl_ms <= on_b.ttl_ms
    on_c = await call(http, replicas.url(2, "pub"), id_=0)
    assert on_c.hit, on_c.cache_status
    assert on_c.json["id"] == 0
    assert await count(public_up, "tools/list") == 1


async def test_a_cold_burst_over_three_replicas_makes_one_upstream_request_and_answers_each_caller_its_own_id(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"pub": public_up}))
    await reset_counts(public_up)
    ids: list[object] = [i if i % 2 else f"burst-{i}" for i in range(150)]
    answers = await asyncio.gather(*(call(http, replicas.url(i % 3, "pub"), id_=id_) for i, id_ in enumerate(ids)))
    assert await count(public_up, "tools/list") == 1
    expected = {**next(a.result for a in answers if a.status == 200), "ttlMs": UPSTREAM_TTL_MS}
    for answer in answers:
        assert_answered(answer, expected, f"caller {answer.sent_id!r}")
    assert sorted(map(str, (a.json["id"] for a in answers))) == sorted(map(str, ids))


# -- one invalidation --------------------------------------------------------------------------------------


@pytest.mark.parametrize("subscriptions_dropped", [False, True], ids=["pubsub-up", "pubsub-killed"])
async def test_a_purge_on_one_replica_leaves_no_replica_answering_from_the_old_entry_a_second_later(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    subscriptions_dropped: bool,
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"pub": public_up}))
    await reset_counts(public_up)
    first = await call(http, replicas.url(0, "pub"))
    old_received_by = time.monotonic()  # the old entry was received before this
    assert first.stored, first.cache_status
    for i in (1, 2, 1, 2):  # in B's and C's local tiers too
        assert (await call(http, replicas.url(i, "pub"))).hit
    if subscriptions_dropped:
        # Every pub/sub connection of the replicas dropped: they must not rely on the message.
        redis_server.command("CLIENT", "KILL", "TYPE", "pubsub")
    assert await purge(http, replicas, 0, upstream="pub", method="tools/list") >= 1
    await asyncio.sleep(INVALIDATION_S)  # the contract's bound: after it no replica may answer from the old entry

    for i in (1, 2, 0):
        asked = time.monotonic()
        answer = await call(http, replicas.url(i, "pub"), id_=f"after-{i}")
        assert_answered(answer, first.result, f"replica {i}")
        # An answer from the old entry has at most this much left (with 50 ms for rounding).
        oldest_possible = UPSTREAM_TTL_MS - (asked - old_received_by) * 1000 + 50
        assert answer.ttl_ms > oldest_possible, f"replica {i} answered from the old entry: {answer.cache_status}"
    assert await count(public_up, "tools/list") == 2  # once before the purge, once after


async def test_a_tool_added_at_run_time_reaches_every_replica(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"chg": changing_up}))
    await wait_for_listening_holder(replicas, "chg")
    for i in (0, 1, 2, 0, 1, 2):  # cached everywhere: only an invalidation shows the new tool
        before = await call(http, replicas.url(i, "chg"))
        assert before.status == 200
    added = (await add_tool(changing_up, unique("cluster_tool")))["added"]
    assert added not in before.tool_names()

    condition, last = lists_tool(replicas, http, "chg", added)
    took = await eventually(condition, limit_s=5, what=f"{added} on every replica", last=last)
    assert took < UPSTREAM_TTL_MS / 1000


@pytest.mark.timeout(90)
async def test_when_the_listen_stream_holder_is_killed_another_replica_holds_it_within_20_s_and_sees_the_next_change(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"chg": changing_up}))
    holder = await wait_for_listening_holder(replicas, "chg")
    for i in (0, 1, 2, 0, 1, 2):
        assert (await call(http, replicas.url(i, "chg"))).status == 200

    replicas.sigkill(holder)
    killed_at = time.monotonic()
    successor = await wait_for_listening_holder(replicas, "chg", limit_s=TAKEOVER_S + 2)
    assert time.monotonic() - killed_at <= TAKEOVER_S
    assert successor != holder
    for i in replicas.indices() * 2:  # cached again on the survivors: only the change can purge it
        assert (await call(http, replicas.url(i, "chg"))).status == 200

    added = (await add_tool(changing_up, unique("after_takeover")))["added"]

    condition, last = lists_tool(replicas, http, "chg", added)
    await eventually(condition, limit_s=5, what=f"{added} on the surviving replicas", last=last)

    await replicas.start(holder)  # back on its port: it joins the cluster, and the lease stays single
    back = await call(http, replicas.url(holder, "chg"))
    assert back.status == 200 and added in back.tool_names()
    assert await lease_holders(replicas, "chg") == [successor]


# -- one prober, one registry ---------------------------------------------------------------------------------


def registry_view(listing: Mapping[str, Any], versions: Mapping[str, Any]) -> dict[str, Any]:
    """What every replica must agree on: per upstream, what the probes found (not the URLs,
    which follow the request's Host, nor the probe times, which move every second)."""
    entries = {}
    for entry in listing["servers"]:
        live_state = entry["_meta"][LIVE_META_KEY]
        entries[live_state["upstream"]] = {
            "name": entry["server"]["name"],
            "version": entry["server"]["version"],
            "era": live_state["era"],
            "supportedVersions": live_state["supportedVersions"],
            "capabilities": live_state["capabilities"],
            "serverInfo": live_state["serverInfo"],
            "health": live_state["health"],
        }
    aggregate = {
        "union": versions["union"],
        "intersection": versions["intersection"],
        "byVersion": versions["byVersion"],
        "upstreams": {n: {k: v[k] for k in ("advertised", "era", "up")} for n, v in versions["upstreams"].items()},
    }
    return {"servers": entries, "versions": aggregate}


async def test_readyz_and_the_registry_documents_agree_on_every_replica_with_one_prober_and_one_listen_stream(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    public_up: Upstream,
    changing_up: Upstream,
) -> None:
    await reset_counts(public_up)
    await reset_counts(changing_up)
    replicas = await start_replicas(cluster_config(redis_server, {"pub": public_up, "chg": changing_up}))
    views: list[dict[str, Any]] = []

    async def all_ready_and_agreeing() -> bool:
        views.clear()
        for i in replicas.indices():
            ready, _ = await replicas.get(i, "/readyz")
            status, listing = await replicas.get(i, "/v0.1/servers")
            _, versions = await replicas.get(i, "/registry/versions")
            if ready != 200 or status != 200:
                return False
            views.append(registry_view(listing, versions))
        return all(v == views[0] for v in views)

    await eventually(all_ready_and_agreeing, limit_s=10, what="/readyz 200 and equal registry documents")
    assert {n: s["health"]["status"] for n, s in views[0]["servers"].items()} == {"pub": "up", "chg": "up"}
    await wait_for_listening_holder(replicas, "chg")
    assert len(await lease_holders(replicas, "pub")) == 1

    # One prober per upstream: probes every 0.8 to 1 s (FAST_REGISTRY) from one replica, not three.
    await reset_counts(changing_up)
    window_s = 2.0
    await asyncio.sleep(window_s)  # a window of time whose probes are counted, not a wait for a state
    counts = await fetch_counts(changing_up)
    assert counts.get("server/discover", 0) <= window_s / 0.8 + 1, counts
    assert counts.get("subscriptions/listen", 0) == 0, counts  # the one stream held stays held
    assert (await fetch_counts(public_up)).get("subscriptions/listen", 0) <= 1


# -- Redis is never a single point of failure --------------------------------------------------------------------


OPERATIONS: list[tuple[str, dict[str, Any]]] = [
    ("tools/list", {}),
    ("prompts/list", {}),
    ("resources/templates/list", {}),
    ("resources/read", {"uri": "res://hello"}),
    ("tools/call", {"name": "add", "arguments": {"a": 40, "b": 2}}),
]


async def direct_results(http: aiohttp.ClientSession, up: Upstream) -> list[dict[str, Any]]:
    return [(await call(http, up.url, m, p)).result for m, p in OPERATIONS]


async def test_with_redis_stopped_callers_get_no_errors_and_cluster_up_says_so_and_sharing_resumes_when_it_returns(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"pub": public_up}))
    await eventually(lambda: all_cluster_up(replicas, 1), limit_s=10, what="cluster_up 1 on every replica")
    expected = await direct_results(http, public_up)
    assert (await call(http, replicas.url(0, "pub"))).stored
    answered: list[Answer] = []
    rounds = 0

    async def one_round() -> None:
        nonlocal rounds
        rounds += 1
        calls = [
            call(http, replicas.url(i, "pub"), m, p, id_=f"r{rounds}-{i}-{n}")
            for i in replicas.indices()
            for n, (m, p) in enumerate(OPERATIONS)
        ]
        got = await asyncio.gather(*calls)
        for n, answer in enumerate(got):
            assert_answered(answer, expected[n % len(OPERATIONS)], f"round {rounds}, {answer.sent_id}")
        answered.extend(got)

    redis_server.stop()

    async def down_everywhere() -> bool:
        await one_round()
        return await all_cluster_up(replicas, 0)

    await eventually(down_everywhere, limit_s=10, what="cluster_up 0 on every replica", every_s=0.1)
    for _ in range(3):  # and on, with the shared tier known to be down
        await one_round()
    for i in replicas.indices():
        status, _ = await replicas.get(i, "/healthz")
        assert status == 200
    assert len(answered) >= 60

    redis_server.start()

    async def up_everywhere() -> bool:
        await one_round()
        return await all_cluster_up(replicas, 1)

    await eventually(up_everywhere, limit_s=15, what="cluster_up 1 again on every replica", every_s=0.2)
    uri = f"res://items/{unique('after-restart')}"
    on_a = await call(http, replicas.url(0, "pub"), "resources/read", {"uri": uri})
    assert on_a.stored, on_a.cache_status
    # A writes it to Redis in the background, after answering: B's first read must find it.
    await eventually(lambda: stored_in_redis(redis_server, uri.encode()), limit_s=5, what="A's entry in Redis")
    on_b = await call(http, replicas.url(1, "pub"), "resources/read", {"uri": uri})
    assert on_b.shared, on_b.cache_status
    assert without_ttl(on_b.result) == without_ttl(on_a.result)


async def test_garbage_over_every_redis_key_gives_misses_and_correct_answers_never_a_500(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"pub": public_up}))
    expected = await direct_results(http, public_up)
    for method, params in OPERATIONS:
        assert (await call(http, replicas.url(0, "pub"), method, params)).status == 200
    await eventually(lambda: stored_in_redis(redis_server, b"hello world"), limit_s=5, what="the entries in Redis")
    assert redis_server.write_garbage_over_every_key() > 0

    for n, (method, params) in enumerate(OPERATIONS):
        answer = await call(http, replicas.url(1, "pub"), method, params, id_=f"b-{n}")
        assert_answered(answer, expected[n], f"{method} on B")
        assert not answer.hit, f"{method} on B: {answer.cache_status}"
    for i in (2, 0, 1):
        for n, (method, params) in enumerate(OPERATIONS):
            answer = await call(http, replicas.url(i, "pub"), method, params, id_=f"{i}-{n}")
            assert_answered(answer, expected[n], f"{method} on replica {i}")
    corrupt = await metric_on(replicas, 1, "mcp_gateway_cluster_reads_total", result="corrupt")
    assert corrupt is not None and corrupt >= 1
    for i in replicas.indices():
        for path in ("/healthz", "/readyz", "/v0.1/servers", "/registry/versions", "/metrics"):
            status, body = await replicas.get(i, path)
            assert status in (200, 503) if path == "/readyz" else status == 200, (i, path, status, body)


# -- what is in Redis ------------------------------------------------------------------------------------------


async def test_redis_holds_only_prefixed_keys_and_never_a_private_answer_an_error_or_a_token(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    private_up: Upstream,
) -> None:
    config = cluster_config(redis_server, {"pub": public_up, "priv": private_up}, auth={"tokens": [CALLER_TOKEN]})
    replicas = await start_replicas(config, 2)
    public_marker, private_marker, error_marker = unique("public"), unique("private"), unique("error")
    caller = replicas.caller_headers
    for i in (0, 1, 0):
        for name in ("pub", "priv"):
            for method, params in OPERATIONS:
                assert (await call(http, replicas.url(i, name), method, params, headers=caller)).status == 200
        public = await call(
            http, replicas.url(i, "pub"), "resources/read", {"uri": f"res://items/{public_marker}"}, headers=caller
        )
        assert public.status == 200
        private = await call(
            http, replicas.url(i, "priv"), "resources/read", {"uri": f"res://items/{private_marker}"}, headers=caller
        )
        assert private.status == 200 and not private.hit, private.cache_status
        failed = await call(
            http, replicas.url(i, "pub"), "resources/read", {"uri": f"res://{error_marker}"}, headers=caller
        )
        assert "error" in failed.json and not failed.hit
    assert await purge(http, replicas, 1, upstream="pub", method="prompts/list") >= 0  # the admin token, sent
    await eventually(
        lambda: stored_in_redis(redis_server, public_marker.encode()), limit_s=5, what="the public read in Redis"
    )

    keys = redis_server.scan_keys()
    assert keys
    assert not [k for k in keys if not k.startswith(KEY_PREFIX.encode())]
    channels = redis_server.channels()
    assert all(c.startswith(KEY_PREFIX.encode()) for c in channels), channels
    blobs = redis_server.blobs()
    for secret in (private_marker, error_marker, CALLER_TOKEN, replicas.admin_token):
        holding = [b[:200] for b in blobs if secret.encode() in b]
        assert not holding, f"{secret} in Redis: {holding}"
    for private_scope in (b'"cacheScope":"private"', b'"cacheScope": "private"'):
        assert not [b[:200] for b in blobs if private_scope in b]


async def test_gateways_with_different_key_prefixes_on_one_redis_never_see_each_other(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    one = await start_replicas(cluster_config(redis_server, {"pub": public_up}, key_prefix="gw-one"), 1, name="one")
    two = await start_replicas(cluster_config(redis_server, {"pub": public_up}, key_prefix="gw-two"), 1, name="two")
    await reset_counts(public_up)
    assert (await call(http, one.url(0, "pub"))).stored
    await eventually(
        lambda: stored_in_redis(redis_server, b"slow_progress", prefix="gw-one"), limit_s=5, what="gw-one's entry"
    )
    on_two = await call(http, two.url(0, "pub"))
    assert on_two.stored and not on_two.hit, on_two.cache_status
    assert await count(public_up, "tools/list") == 2
    await eventually(
        lambda: stored_in_redis(redis_server, b"slow_progress", prefix="gw-two"), limit_s=5, what="gw-two's entry"
    )

    await purge(http, one, 0)
    await asyncio.sleep(INVALIDATION_S)  # the contract's bound: a purge that would reach two has by now
    assert (await call(http, two.url(0, "pub"))).hit  # one's purge is not two's
    assert not (await call(http, one.url(0, "pub"))).hit
    keys = redis_server.scan_keys()
    assert all(k.startswith((b"gw-one", b"gw-two")) for k in keys), keys


# -- --workers N: one gateway per process group ------------------------------------------------------------------


def requests_total(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    labels = (("method", "tools/list"), ("status", "200"), ("upstream", "pub"))
    return samples.get(("mcp_gateway_requests_total", labels), 0.0)


async def start_worker_group(
    redis_server: RedisServer, start_replicas: StartReplicas, public_up: Upstream, with_cluster: bool
) -> Replicas:
    """One ``serve --workers 2`` in front of ``public_up``, with or without ``[cluster]``."""
    config = cluster_config(redis_server, {"pub": public_up})
    if not with_cluster:
        del config["cluster"]
    return await start_replicas(config, 1, extra_args=("--workers", "2"))


@pytest.mark.parametrize("with_cluster", [True, False], ids=["cluster", "no-cluster"])
async def test_workers_scrapes_are_monotonic_and_sum_over_the_workers(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    fresh_http: aiohttp.ClientSession,
    public_up: Upstream,
    with_cluster: bool,
) -> None:
    replicas = await start_worker_group(redis_server, start_replicas, public_up, with_cluster)
    seen: list[float] = []
    sent = 0
    for _ in range(12):
        for _ in range(4):
            assert (await call(fresh_http, replicas.url(0, "pub"))).status == 200
            sent += 1
        seen.append(requests_total(await replicas.metrics(0)))
    assert seen == sorted(seen), f"a counter went backwards between scrapes: {seen}"

    async def sums_every_request() -> bool:
        seen.append(requests_total(await replicas.metrics(0)))
        return seen[-1] == sent

    await eventually(sums_every_request, limit_s=5, what=f"requests_total == {sent} (scrapes: {seen})")
    assert seen == sorted(seen), seen


@pytest.mark.parametrize(
    ("with_cluster", "redis_down"),
    [(True, False), (True, True), (False, False)],
    ids=["cluster", "cluster-redis-down", "no-cluster"],
)
async def test_a_purge_reaches_every_worker(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    fresh_http: aiohttp.ClientSession,
    public_up: Upstream,
    with_cluster: bool,
    redis_down: bool,
) -> None:
    replicas = await start_worker_group(redis_server, start_replicas, public_up, with_cluster)
    if redis_down:
        redis_server.stop()

        async def every_worker_noticed() -> bool:  # each serves on its own
            return replicas.log(0).count("shared tier down") >= 2

        await eventually(every_worker_noticed, limit_s=10, what="both workers saying the shared tier is down")
    first = await call(fresh_http, replicas.url(0, "pub"))
    old_received_by = time.monotonic()
    assert first.status == 200
    for _ in range(11):  # on fresh connections: both workers end up holding the entry
        assert (await call(fresh_http, replicas.url(0, "pub"))).status == 200
    assert (await replicas.metric(0, "mcp_gateway_cache_entries") or 0) >= 1
    # With Redis down the purge reaches the other workers (their bus), not the cluster: it says so.
    expected = None if not with_cluster else "pending" if redis_down else "done"
    await purge(fresh_http, replicas, 0, upstream="pub", cluster=expected)

    async def no_entries_left() -> bool:  # the sum over both workers, each sampled every second
        metrics = await replicas.metrics(0)
        return metrics.get(("mcp_gateway_cache_entries", ())) == metrics.get(("mcp_gateway_cache_bytes", ())) == 0

    await eventually(no_entries_left, limit_s=10, what="the size gauges at 0 after the purge")
    await asyncio.sleep(INVALIDATION_S)  # the contract's bound, then no worker may answer from the old entry
    for n in range(12):
        asked = time.monotonic()
        answer = await call(fresh_http, replicas.url(0, "pub"), id_=n)
        assert_answered(answer, first.result, f"request {n} after the purge")
        oldest_possible = UPSTREAM_TTL_MS - (asked - old_received_by) * 1000 + 50
        assert answer.ttl_ms > oldest_possible, f"request {n} answered from the old entry: {answer.cache_status}"


# -- check-config ----------------------------------------------------------------------------------------------

GOOD_URL = "redis://127.0.0.1:6379/0"
BAD_CLUSTER_TABLES: list[tuple[dict[str, Any], str]] = [
    ({"redis_url": "http://x"}, "cluster.redis_url"),
    ({"redis_url": "redis://h/notanumber"}, "cluster.redis_url"),
    ({"redis_url": "redis://h:notaport/0"}, "cluster.redis_url"),
    ({"redis_url": "redis:///0"}, "cluster.redis_url"),
    ({}, "cluster.redis_url"),
    ({"redis_url": GOOD_URL, "key_prefix": "a b"}, "cluster.key_prefix"),
    ({"redis_url": GOOD_URL, "key_prefix": ""}, "cluster.key_prefix"),
    ({"redis_url": GOOD_URL, "timeout_s": 0}, "cluster.timeout_s"),
    ({"redis_url": GOOD_URL, "pool": 3}, "cluster.pool"),
]


def write_config(path: Path, cluster: Mapping[str, Any]) -> Path:
    path.write_text(dump_toml({"cluster": dict(cluster), "upstreams": {"up": {"url": "http://127.0.0.1:9/mcp"}}}))
    return path


async def check_config(path: Path, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """``mcp-gateway check-config PATH`` as operators run it: ``(exit status, stdout + stderr)``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "check-config", str(path),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=REPO_ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def test_check_config_exits_2_naming_the_bad_cluster_key(tmp_path: Path) -> None:
    paths = [write_config(tmp_path / f"bad-{n}.toml", table) for n, (table, _) in enumerate(BAD_CLUSTER_TABLES)]
    done = await asyncio.gather(*(check_config(path) for path in paths))  # one at a time takes a second each
    for (table, bad_key), (status, output) in zip(BAD_CLUSTER_TABLES, done, strict=True):
        assert status == 2, (table, output)
        assert bad_key in output, (table, output)


async def test_check_config_accepts_rediss_with_a_password_from_the_environment(tmp_path: Path) -> None:
    table = {"redis_url": "rediss://gateway:${REDIS_PASSWORD}@127.0.0.1:6380/2", "key_prefix": "prod.gw-1"}
    status, output = await check_config(
        write_config(tmp_path / "good.toml", table), env={"REDIS_PASSWORD": "s3cret-from-the-secret"}
    )
    assert status == 0, output
    assert "s3cret" not in output


async def test_check_config_names_cluster_secret_when_a_remote_redis_has_none_or_a_short_one_and_never_prints_it(
    tmp_path: Path,
) -> None:
    remote = "rediss://redis.example:6380/0"
    short, good = "short-secret-15", "a-secret-of-sixteen+"
    cases = [
        ({"redis_url": remote}, {}, 2),
        ({"redis_url": "redis://10.1.2.3:6379/0"}, {}, 2),
        ({"redis_url": GOOD_URL, "secret": "${CLUSTER_SECRET}"}, {"CLUSTER_SECRET": short}, 2),
        ({"redis_url": remote, "secret": "${CLUSTER_SECRET}"}, {"CLUSTER_SECRET": short}, 2),
        ({"redis_url": remote, "secret": "${CLUSTER_SECRET}"}, {"CLUSTER_SECRET": good}, 0),
        ({"redis_url": "redis://localhost:6379/0"}, {}, 0),
        ({"redis_url": "redis://127.8.9.10:6379/0"}, {}, 0),
        ({"redis_url": "redis://[::1]:6379/0"}, {}, 0),
    ]
    done = await asyncio.gather(
        *(check_config(write_config(tmp_path / f"s-{n}.toml", table), env) for n, (table, env, _) in enumerate(cases))
    )
    for (table, _, expected), (status, output) in zip(cases, done, strict=True):
        assert status == expected, (table, output)
        if expected:
            assert "cluster.secret" in output, (table, output)
        assert short not in output and good not in output, output
