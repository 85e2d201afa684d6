"""``POST /mcp`` attacked, second pass: its interplay with the per-upstream route's machinery
(coalescing, stale-if-error, refresh-ahead, purges, the shared tier), the listen hub, logs and
metrics, and the freshness of composed answers.

The first pass is ``test_attacks.py``; nothing here repeats it. The tests under "defects" each
reproduce a defect and fail until it is fixed (the comment says what should happen); those
under "attacks that held" pin what resisted. Members are scripted
:class:`~tests.support.FakeUpstream` s in this process unless a test needs a real SDK server or a
real gateway process; the cluster tests use a real Redis (the ``redis`` fixture) and gateways
in-process on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.app import PROXY, REGISTRY, STORE
from gateway.cache import Invalidation

from ..cluster.test_tier import connected
from ..support import FakeClock, FakeUpstream, RunningGateway, StartGateway, StartUpstream, mcp_headers
from ..support.fleet import Upstream, add_tool, fetch_counts, reset_counts
from ..support.redis import RedisServer
from ..test_workers import serve_group
from .conftest import FAST_REGISTRY, agg, aggregate_config, body_of, eventually, names
from .test_listen import listen, unique

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]
ADMIN = "second-pass-admin-token-0123456789"
ROOT = Path(__file__).resolve().parent.parent.parent
CHANGED = b"notifications/tools/list_changed"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real Redis of this test (as tests/cluster/conftest.py's ``redis_server``)."""
    server = RedisServer(tmp_path / "redis")
    try:
        yield server
    finally:
        server.close()


def result_of(msg: Any, result: dict[str, Any]) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def tools_result(*tool_names: str, ttl_ms: int = 60_000, scope: str = "public", **more: Any) -> dict[str, Any]:
    tools = [{"name": n, "inputSchema": {"type": "object"}} for n in tool_names]
    return {"tools": tools, "resultType": "complete", "cacheScope": scope, "ttlMs": ttl_ms, **more}


def tools(*tool_names: str, **kw: Any) -> Handler:
    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(*tool_names, **kw))

    return handler


async def member(start_upstream: StartUpstream, *tool_names: str, **kw: Any) -> FakeUpstream:
    up = await start_upstream()
    up.handlers["tools/list"] = tools(*tool_names, **kw)
    return up


async def purge(http: aiohttp.ClientSession, gw: RunningGateway, **query: str) -> dict[str, Any]:
    async with http.post(
        f"{gw.base_url}/admin/cache/purge", params=query, headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


async def listening_to(gw: RunningGateway, upstream: str) -> None:
    """Until the gateway's own listen stream to ``upstream`` is acknowledged."""
    state = gw.app[REGISTRY].state

    async def acknowledged() -> bool:
        return state.upstreams[upstream].listen.state == "acknowledged"

    await eventually(acknowledged, limit_s=10, what=f"the gateway's listen stream to {upstream}")


# == defects ======================================================================================
# Each test below fails on the code as it is (3f34338); its comment says what should happen instead.

# -- E1: a composed answer says more ttlMs than its stalest part has left ------------------------


async def test_a_composed_answer_never_says_more_ttl_than_its_stalest_part_has_left(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    # docs/aggregate.md "Hints": "ttlMs is the least time left among the parts". Member f's entry has 10 s
    # left when the composition reads it; member s takes 4 s (of the gateway's clock) to answer.
    # Today compose.hints takes f's ttl_ms as read at the start (10000) and Aggregate._store
    # builds the stored answer from that figure at the end: the answer and the stored entry say
    # 4 s more than f has left, and a hit 5 s later still says 5000 ms where f has 1000 ms left
    # (the stored answer's expiry is 4 s past its part's; only ComposedEntry.current hides that).
    fast = await member(start_upstream, "f", ttl_ms=10_000)
    slow = await start_upstream()

    async def slow_list(request: web.Request, msg: Any) -> web.StreamResponse:
        fake_clock.advance(4)
        return result_of(msg, tools_result("s", ttl_ms=60_000))

    slow.handlers["tools/list"] = slow_list
    gw = await start_gateway(aggregate_config({"f": fast.url, "s": slow.url}), clock=fake_clock)
    assert (await agg(http, gw.url("f"), "tools/list")).status == 200  # f's entry: 10 s from now
    composed = await agg(http, gw, "tools/list")
    assert names(composed.result) == ["f__f", "s__s"]
    assert composed.result["ttlMs"] <= 6_000, f"f has 6000 ms left; the answer says {composed.result['ttlMs']}"
    fake_clock.advance(5)  # f: 1 s left
    hit = await agg(http, gw, "tools/list")
    assert hit.cache_hit, hit.cache_status
    assert hit.result["ttlMs"] <= 1_000, f"f has 1000 ms left; the hit says {hit.result['ttlMs']}"


# -- E2: a member's private answer read through /mcp does not end its stale window ----------------


async def test_a_private_answer_read_through_mcp_ends_the_members_stale_window(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    # docs/cache.md "Stale-if-error": "an upstream whose newer answer is private, has no ttlMs or needs
    # input ends its older entry's stale window". On /servers/m/mcp it does (the forwarder calls
    # store.supersede, and Cluster.supersede). Through /mcp, PartFetcher._send stores nothing and
    # supersedes nothing:
    # once m then fails, its old public list is served stale on both routes, to every caller,
    # although m's last word was that the list is private.
    up = await start_upstream()
    state = {"mode": "public"}

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        if state["mode"] == "public":
            return result_of(msg, tools_result("old_public", ttl_ms=1_000))
        if state["mode"] == "private":
            return result_of(msg, tools_result("mine", scope="private"))
        return web.Response(status=503, text="<html>down</html>", content_type="text/html")

    up.handlers["tools/list"] = answer
    other = await member(start_upstream, "ok")
    config = aggregate_config({"m": {"url": up.url, "stale_if_error_ms": 600_000}, "o": other.url})
    gw = await start_gateway(config, clock=fake_clock)
    assert "stored" in (await agg(http, gw.url("m"), "tools/list")).cache_status
    fake_clock.advance(2)  # expired: kept for its stale window
    state["mode"] = "private"
    private = await agg(http, gw, "tools/list")  # m asked through /mcp: its newer answer is private
    assert names(private.result) == ["m__mine", "o__ok"]
    state["mode"] = "down"
    own = await agg(http, gw.url("m"), "tools/list", id="own")
    assert own.status == 502, f"m's old public list served stale after a private answer: {own.cache_status}"
    composed = await agg(http, gw, "tools/list")
    assert "m__old_public" not in names(composed.result), composed.raw


# -- E3: an answer fetched before a purge is stored after it, and /mcp composes from it ------------


async def test_an_answer_in_flight_across_a_purge_is_not_what_mcp_composes_afterwards(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # A purge (POST /admin/cache/purge, or a list_changed notification) while a per-upstream
    # tools/list of m is in flight: m read its list before the change, and answers after the
    # purge. The refresh-ahead path and /mcp's own parts (PartFetcher._send) refuse to store such
    # an answer (store.purges moved); the per-upstream forwarder (Forwarder._maybe_store) stores
    # it, so the next /mcp list is composed from the list the purge was meant to remove, as a hit
    # ("detail=composed"), for the entry's whole ttlMs.
    up = await start_upstream()
    listed = {"now": "old"}
    arrived, release = asyncio.Event(), asyncio.Event()

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        snapshot = listed["now"]  # what m lists when the request arrives
        if not release.is_set():
            arrived.set()
            await release.wait()
        return result_of(msg, tools_result(snapshot))

    up.handlers["tools/list"] = answer
    gw = await start_gateway(aggregate_config({"m": up.url}, admin={"token": ADMIN}))
    in_flight = asyncio.create_task(agg(http, gw.url("m"), "tools/list"))
    async with asyncio.timeout(5):
        await arrived.wait()
    listed["now"] = "new"  # m's list changes ...
    await purge(http, gw, upstream="m")  # ... and the operator purges m
    release.set()
    assert names((await in_flight).result) == ["old"]  # it was in flight: its caller gets it
    after = await agg(http, gw, "tools/list")
    assert names(after.result) == ["m__new"], (after.cache_status, after.raw)


# -- E4: a member's error text is logged whole ------------------------------------------------------


async def test_a_members_long_error_message_is_not_logged_whole(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 17: bounded log volume. gateway/aggregate/members.py cuts a caller's strings short
    # (quoted(): 80 characters), but MemberCollector._log writes MemberList.problem, which for a
    # member's JSON-RPC error is MemberError.message: the member's whole error.message (repr). A
    # member answering a 1 MB error message makes the gateway write a 1 MB log line (once per
    # 10 s since 3f34338; on every list before), and one of ~1 MB per member per request into the
    # 502 answer when every member fails.
    good = await member(start_upstream, "ok")
    bad = await start_upstream()

    async def error(request: web.Request, msg: Any) -> web.StreamResponse:
        return web.json_response(
            {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": "x" * 1_000_000}}
        )

    bad.handlers["tools/list"] = error
    gw = await start_gateway(aggregate_config({"g": good.url, "b": bad.url}))
    with caplog.at_level(logging.INFO, logger="mcp_gateway.aggregate"):
        reply = await agg(http, gw, "tools/list")
    assert reply.status == 200 and names(reply.result) == ["g__ok"]
    longest = max((len(r.getMessage()) for r in caplog.records if r.name == "mcp_gateway.aggregate"), default=0)
    assert 0 < longest < 2_000, f"a log line of {longest} characters"


# -- E5: the requests /mcp makes to members are in no upstream metric ------------------------------


async def test_the_requests_mcp_sends_to_members_are_counted_in_the_upstream_durations(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/metrics.md "Metrics": mcp_gateway_upstream_request_duration_seconds is "time the upstream
    # took". A /mcp list that asks its members (Cache-Status fwd=miss) sends them requests of
    # their own (PartFetcher._send), but Exchange.upstream_seconds is never set for them: the
    # histogram counts nothing, under the member or under /mcp, so a member reached only through
    # /mcp shows no upstream traffic at all (the per-upstream route counts one per request).
    a, b = await member(start_upstream, "ta"), await member(start_upstream, "tb")
    gw = await start_gateway(aggregate_config({"a": a.url, "b": b.url}, cache={"max_entries": 0}))
    for i in range(3):
        reply = await agg(http, gw, "tools/list", id=i)
        assert reply.status == 200 and "fwd=miss" in reply.cache_status
    assert a.count("tools/list") == b.count("tools/list") == 3
    assert (await agg(http, gw.url("a"), "tools/list")).status == 200  # the control: one on a's own route

    def counted(upstream: str) -> float:
        gw.app[PROXY].journal.drain()
        labels = {"upstream": upstream, "method": "tools/list"}
        value = gw.registry.get_sample_value("mcp_gateway_upstream_request_duration_seconds_count", labels)
        return value or 0.0

    assert counted("a") >= 1  # the per-upstream request is counted
    by_mcp = counted("a") + counted("b") + counted("/mcp") - 1
    assert by_mcp >= 3, f"6 member requests made by 3 /mcp lists; the upstream histogram counts {by_mcp:g}"


# -- E6: Redis not taking writes makes /mcp leave a paged member out -------------------------------


def paged_tools(pages: int) -> Handler:
    """tools/list in ``pages`` pages of one tool each (cursor "p<n>"), answered at once."""

    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        cursor = msg["params"].get("cursor")
        n = 1 if cursor is None else int(cursor[1:])
        more: dict[str, Any] = {"nextCursor": f"p{n + 1}"} if n < pages else {}
        return result_of(msg, tools_result(f"t{n}", **more))

    return handler


async def test_with_redis_paused_for_writes_a_paged_member_is_still_listed_whole(
    redis: RedisServer, start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/replicas.md "Redis down or slow": every Redis call waits at most cluster.timeout_s, "callers
    # are answered from the local tier or the upstream, never with an error caused by Redis".
    # While Redis takes no writes (CLIENT PAUSE WRITE: cluster_up stays 1, reads answer), each
    # cold page waits a lock call's timeout_s (0.25 s) before it goes upstream. The
    # per-upstream route pays that once per request; /mcp pays it once per page, one page after
    # another, all within the member's timeout_s (members.py): a 5-page member with
    # timeout_s 1 is left out of /mcp (detail=partial, ttlMs 0) while each of its pages is
    # served fine on /servers/p/mcp.
    paged = await start_upstream()
    paged.handlers["tools/list"] = paged_tools(5)
    good = await member(start_upstream, "ok")
    config = aggregate_config(
        {"g": good.url, "p": {"url": paged.url, "timeout_s": 1.0}},
        cluster={"redis_url": redis.url, "key_prefix": "e6"},
    )
    gw = await start_gateway(config)
    await connected(gw)
    redis.pause(5, mode="WRITE")
    try:
        own = await agg(http, gw.url("p"), "tools/list", {"cursor": "p3"})
        assert own.status == 200 and names(own.result) == ["t3"], own.raw  # its own route: fine
        reply = await agg(http, gw, "tools/list")
    finally:
        redis.unpause()
    assert reply.status == 200
    assert names(reply.result) == ["g__ok", *(f"p__t{i}" for i in range(1, 6))], (reply.cache_status, reply.raw)


# -- E7: a /mcp page cut by its member's timeout sends every waiting caller upstream alone ---------


async def test_callers_waiting_on_a_page_mcp_gave_up_on_make_one_upstream_request_not_one_each(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/cache.md "Coalescing": concurrent misses on one key make one upstream request. /mcp leads the
    # key of p's page 2 (cursor "c2") when it asks for it; callers of that same page on
    # /servers/p/mcp join it. When p's pages run past its timeout_s, collect() cancels the page:
    # PartFetcher._lead releases the followers with None, the coalescer's "not storable: each
    # goes alone", and all of them send p the same request at once (8 here, each then stored
    # over the last), though p answers each within its timeout_s.
    up = await start_upstream()

    async def slow_pages(request: web.Request, msg: Any) -> web.StreamResponse:
        cursor = msg["params"].get("cursor")
        await asyncio.sleep(0.3 if cursor is None else 0.4)
        more: dict[str, Any] = {"nextCursor": "c2"} if cursor is None else {}
        return result_of(msg, tools_result("t2" if cursor else "t1", **more))

    up.handlers["tools/list"] = slow_pages
    good = await member(start_upstream, "ok")
    gw = await start_gateway(aggregate_config({"g": good.url, "p": {"url": up.url, "timeout_s": 0.5}}))
    composed = asyncio.create_task(agg(http, gw, "tools/list"))
    await asyncio.sleep(0.38)  # /mcp asked for page 2 at 0.3 s; it gives up at 0.5 s
    assert up.count("tools/list", '"c2"') == 1
    own = await asyncio.gather(*(agg(http, gw.url("p"), "tools/list", {"cursor": "c2"}, id=i) for i in range(8)))
    assert [r.json["id"] for r in own] == list(range(8)) and all(names(r.result) == ["t2"] for r in own)
    assert "detail=partial" in (await composed).cache_status  # p was cut short
    page_2 = up.count("tools/list", '"c2"')
    assert page_2 <= 2, f"8 callers waiting on one page made {page_2} requests for it"


# -- E8: a member at max_inflight, met by /mcp, backs its key off for its own route ----------------


async def test_a_member_busy_when_mcp_asks_is_not_taken_for_a_failing_one_on_its_own_route(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    # docs/cache.md "Stale-if-error": an expired entry answers only when fetching it again fails (the
    # upstream refused, reset, timed out, a 5xx...), and "after a failed attempt the key backs
    # off". Over max_inflight is not an attempt: on /servers/m/mcp it is a 503 and no backoff.
    # PartFetcher._lead counts Overloaded among MemberFailed and calls backoff.failed(key): for
    # the next second (up to 8 s after more) /servers/m/mcp answers m's stale list without asking
    # m, idle and healthy by then. (With [cluster], where an await comes between claiming the key
    # and the Overloaded, its coalesced followers also get Failed(Overloaded), re-raised without
    # its Retry-After header; not shown here.)
    up = await start_upstream()
    release = asyncio.Event()
    listed = {"now": "old"}

    async def answer_list(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(listed["now"], ttl_ms=1_000))

    async def hang(request: web.Request, msg: Any) -> web.StreamResponse:
        await release.wait()
        return result_of(msg, {"content": [], "resultType": "complete"})

    up.handlers["tools/list"] = answer_list
    up.handlers["tools/call"] = hang
    other = await member(start_upstream, "ok")
    config = aggregate_config({"m": {"url": up.url, "max_inflight": 1, "stale_if_error_ms": 600_000}, "o": other.url})
    gw = await start_gateway(config, clock=fake_clock)
    assert "stored" in (await agg(http, gw.url("m"), "tools/list")).cache_status
    fake_clock.advance(2)  # m's entry expired; kept for stale-if-error
    call = asyncio.create_task(agg(http, gw.url("m"), "tools/call", {"name": "slow", "arguments": {}}))
    await eventually(lambda: _true(up.count("tools/call") == 1), limit_s=5, what="the call at m")
    busy = await agg(http, gw, "tools/list")  # m is at max_inflight: its stale part stands in (documented)
    assert "detail=stale" in busy.cache_status  # its expired entry stood in
    release.set()
    await call
    listed["now"] = "new"
    fake_clock.advance(0.5)
    own = await agg(http, gw.url("m"), "tools/list")
    assert names(own.result) == ["new"], f"m idle and answering, yet: {own.cache_status} {names(own.result)}"


# -- E9: with [cluster], one change of a member is two notifications ----------------------------------


async def test_with_cluster_one_change_of_a_member_is_one_notification(
    redis: RedisServer,
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    changing_up: Upstream,
) -> None:
    # The registry's invalidation goes through Cluster.invalidate_soon: store.purge now (the hub
    # tells its clients), then Cluster._spread purges the local tier once more after Redis took
    # the generation bump (for entries stored meanwhile). MemoryStore.purge calls on_purge each
    # time, so ListenHub.purged tells every /mcp listen client twice: two
    # notifications/tools/list_changed per change, and every client lists again twice. Without
    # [cluster] it is one (the control below the assert shows it is not the member sending two).
    cluster = {"redis_url": redis.url, "key_prefix": "e9"}
    counts = {}
    for with_cluster in (False, True):
        more: dict[str, Any] = {"cluster": cluster} if with_cluster else {}
        gw = await start_gateway(aggregate_config({"a": public_up, "c": changing_up}, registry=FAST_REGISTRY, **more))
        await listening_to(gw, "c")
        async with listen(http, gw, "one", {"toolsListChanged": True}) as stream:
            assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
            await add_tool(changing_up, unique("e9"))
            await stream.next_of("notifications/tools/list_changed")
            told = 1
            with contextlib.suppress(TimeoutError):
                while True:
                    await stream.next_of("notifications/tools/list_changed", timeout_s=1.0)
                    told += 1
        counts[with_cluster] = told
        await gw.server.close()
    assert counts[False] == 1, counts  # the control: one change, one notification
    assert counts[True] == 1, f"with [cluster] one change was {counts[True]} notifications"


# -- E10: with --workers 2, one change of a member is two notifications on every /mcp stream --------


async def test_with_two_workers_each_change_of_a_member_is_one_notification_per_stream(
    tmp_path: Path, public_up: Upstream, changing_up: Upstream
) -> None:
    # Without [cluster] each worker probes the members and holds its own listen stream to them
    # (registry per process), and passes every invalidation to the other worker on the bus
    # (gateway/cluster/workers.py). So each worker purges twice per change, once from its own
    # stream and once from the other's message, and ListenHub.purged tells its clients each
    # time: two notifications/tools/list_changed per change on every /mcp listen stream (a
    # stream whose worker heard both before writing gets one).
    await reset_counts(changing_up)
    config = (
        "[registry]\nprobe_min_interval_s = 0.2\nprobe_max_interval_s = 0.4\nbackoff_base_s = 0.1\n"
        f'backoff_max_s = 0.4\n[upstreams.a]\nurl = "{public_up.url}"\n[upstreams.c]\nurl = "{changing_up.url}"\n'
        "[aggregate]\n"
    )
    async with serve_group(tmp_path, config) as base_url:

        async def both_listening() -> bool:  # each worker holds its own listen stream to c
            return (await fetch_counts(changing_up)).get("subscriptions/listen", 0) >= 2

        await eventually(both_listening, limit_s=15, what="both workers' listen streams to c")
        await asyncio.sleep(1)  # acknowledged
        body = json.dumps(body_of("subscriptions/listen", {"notifications": {"toolsListChanged": True}}))
        streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(4):  # new connections: either worker may accept each
                reader, writer = await asyncio.open_connection("127.0.0.1", int(base_url.rsplit(":", 1)[1]))
                head = ["POST /mcp HTTP/1.1", f"Host: {base_url[7:]}", f"Content-Length: {len(body)}"]
                head += [f"{k}: {v}" for k, v in mcp_headers("subscriptions/listen").items()]
                writer.write(("\r\n".join(head) + "\r\n\r\n" + body).encode())
                got = b""
                async with asyncio.timeout(10):
                    while b"acknowledged" not in got:
                        got += await reader.read(65536)
                streams.append((reader, writer))
            for _ in range(3):  # three changes, a second apart
                await add_tool(changing_up, unique("e10"))
                await asyncio.sleep(1)
            told = []
            for reader, _ in streams:
                got = b""
                # Until the three have come (at most 10 s), then 0.2 s more for any extra one.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        while got.count(CHANGED) < 3 and (chunk := await reader.read(65536)):
                            got += chunk
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        while chunk := await reader.read(65536):
                            got += chunk
                told.append(got.count(CHANGED))
        finally:
            for _, writer in streams:
                writer.close()
    assert told == [3, 3, 3, 3], f"notifications per stream for three changes: {told}"


# == attacks that held (regression tests) ==========================================================


async def test_changes_of_an_upstream_that_is_not_a_member_never_reach_mcp_listen_clients(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, changing_up: Upstream
) -> None:
    # ListenHub.purged drops invalidations of upstreams outside [aggregate].upstreams, a lost
    # stream of one included.
    gw = await start_gateway(
        aggregate_config({"a": public_up, "c": changing_up}, {"upstreams": ["a"]}, registry=FAST_REGISTRY)
    )
    await listening_to(gw, "c")  # c is an upstream of the gateway, not a member of /mcp
    async with listen(http, gw, "only-a", {"toolsListChanged": True}) as stream:
        assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
        await add_tool(changing_up, unique("not_a_member"))
        gw.app[STORE].purge(Invalidation("c", None), "stream_lost")  # a non-member's stream lost, too
        with pytest.raises(TimeoutError):
            await stream.next_of("notifications/tools/list_changed", timeout_s=1.5)


async def test_over_one_redis_mcp_composes_from_another_gateways_parts_hears_its_purge_and_survives_garbage(
    redis: RedisServer, start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Two gateways on one Redis: b composes from a's shared parts (no member request), a purge
    # on a reaches b's parts (its composed answer is composed again), garbage over every Redis
    # key is a miss (answered from the members, right ids), and with Redis killed both serve.
    up = await start_upstream()
    listed = {"now": "v1"}

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(listed["now"]))

    up.handlers["tools/list"] = answer
    other = await member(start_upstream, "ok")
    config = aggregate_config(
        {"m": up.url, "o": other.url},
        cluster={"redis_url": redis.url, "key_prefix": "h1"},
        admin={"token": ADMIN},
    )
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    assert names((await agg(http, a, "tools/list")).result) == ["m__v1", "o__ok"]

    async def parts_shared() -> bool:  # a writes the parts to Redis in the background
        return len(redis.scan_keys("h1:entry:*")) == 2

    await eventually(parts_shared, limit_s=5, what="both parts in Redis")
    on_b = await agg(http, b, "tools/list")
    assert names(on_b.result) == ["m__v1", "o__ok"] and up.count("tools/list") == 1, on_b.cache_status
    listed["now"] = "v2"
    await purge(http, a, upstream="m")  # on a: b's copy of m's part and its composed answer go too

    async def b_lists_v2() -> bool:
        return names((await agg(http, b, "tools/list")).result) == ["m__v2", "o__ok"]

    await eventually(b_lists_v2, limit_s=3, what="b composing m's list again after a's purge")

    async def locks_released() -> bool:  # garbage over a held lock: its followers would wait it out
        return not redis.scan_keys("h1:lock:*")

    await eventually(locks_released, limit_s=5, what="the flights' locks released")
    assert redis.write_garbage_over_every_key() > 0
    a.app[STORE].purge(lambda _k: True, "test")  # the local tiers cold: the next parts come from Redis
    b.app[STORE].purge(lambda _k: True, "test")
    for gw in (a, b):
        reply = await agg(http, gw, "tools/list", id="g")
        assert (reply.status, reply.json["id"], names(reply.result)) == (200, "g", ["m__v2", "o__ok"]), reply.raw
    redis.kill()
    for gw in (a, b):
        reply = await agg(http, gw, "tools/list")
        assert reply.status == 200 and names(reply.result) == ["m__v2", "o__ok"], reply.raw


async def test_a_cold_burst_of_mcp_and_own_route_lists_is_one_member_request_each_caller_its_own_id(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # 10 /mcp lists and 10 /servers/m/mcp lists of a cold key at once: one request to m.
    up = await start_upstream()

    async def slow(request: web.Request, msg: Any) -> web.StreamResponse:
        await asyncio.sleep(0.3)
        return result_of(msg, tools_result("t"))

    up.handlers["tools/list"] = slow
    gw = await start_gateway(aggregate_config({"m": up.url}))
    replies = await asyncio.gather(
        *(agg(http, gw if i % 2 else gw.url("m"), "tools/list", id=f"c{i}") for i in range(20))
    )
    assert up.count("tools/list") == 1
    for i, reply in enumerate(replies):
        assert reply.json["id"] == f"c{i}"
        assert names(reply.result) == (["m__t"] if i % 2 else ["t"])


async def test_a_burst_of_changes_is_one_notification_per_kind_for_a_listening_client(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Since f9d7293 a client's pending changes are a set of kinds: 1000 changes while it is
    # being written to are one notification (before, a queue of 1000).
    up = await member(start_upstream, "t")  # never probed right: every flag offered
    gw = await start_gateway(aggregate_config({"a": up.url}, registry=FAST_REGISTRY))
    async with listen(http, gw, "burst", {"toolsListChanged": True, "promptsListChanged": True}) as stream:
        assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
        for _ in range(1000):
            gw.app[STORE].purge(Invalidation("a", ("tools/list",)), "notification")
        told = [await stream.next()]
        with contextlib.suppress(TimeoutError):
            while True:
                told.append(await stream.next(timeout_s=0.5))
    assert [m["method"] for m in told] == ["notifications/tools/list_changed"], told


async def test_a_purge_while_a_composition_is_in_flight_is_never_undone_by_it(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Member s is slow; member f's part comes from the cache. A purge of f and of s (an admin
    # purge, as a notification would) while /mcp waits for s: the caller in flight gets what was
    # read, but nothing it read before the purge is stored or answered afterwards.
    listed = {"f": "f1", "s": "s1"}
    arrived, release = asyncio.Event(), asyncio.Event()
    f, s = await start_upstream(), await start_upstream()

    async def fast(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(listed["f"]))

    async def slow(request: web.Request, msg: Any) -> web.StreamResponse:
        snapshot = listed["s"]
        if not release.is_set():
            arrived.set()
            await release.wait()
        return result_of(msg, tools_result(snapshot))

    f.handlers["tools/list"], s.handlers["tools/list"] = fast, slow
    gw = await start_gateway(aggregate_config({"f": f.url, "s": s.url}, admin={"token": ADMIN}))
    assert (await agg(http, gw.url("f"), "tools/list")).status == 200
    in_flight = asyncio.create_task(agg(http, gw, "tools/list"))
    async with asyncio.timeout(5):
        await arrived.wait()
    listed.update(f="f2", s="s2")
    await purge(http, gw, upstream="f")
    await purge(http, gw, upstream="s")
    release.set()
    assert names((await in_flight).result) == ["f__f1", "s__s1"]
    after = await agg(http, gw, "tools/list")
    assert names(after.result) == ["f__f2", "s__s2"] and not after.cache_hit, after.cache_status


async def _true(value: bool) -> bool:
    return value
