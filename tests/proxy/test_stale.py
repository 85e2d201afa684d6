"""Serving through upstream failures (stale-if-error) and refresh-ahead, against a scripted
upstream (tests/support FakeUpstream) whose answer the test switches, with a fake clock.

Stale-if-error: an expired public entry, kept ``stale_if_error_ms`` past its expiry, answers
only when fetching it again fails (refused, timed out, a 5xx or 2xx that is no JSON-RPC answer),
never in place of a JSON-RPC answer, never for a private answer nor after a purge or a
notification. Refresh-ahead: a hit in the last part of an entry's lifetime fetches it again
in the background, once per key; keys nobody asks for just expire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import PROXY, REGISTRY, create_app
from gateway.cache import invalidation
from gateway.config import parse_config

from ..support import FakeClock, FakeUpstream, RunningGateway, StartGateway, list_result, mcp_headers, rpc
from ..support.coalescing import Followers
from ..support.polling import wait_until
from ..support.wire import sse_frame, sse_messages

pytestmark = pytest.mark.timeout(60)

ADMIN = "admin-token-0123456789ab"
TTL_MS = 10_000
STALE_MS = 30_000

Reply = tuple[int, str, Any]


#: The JSON-RPC error an upstream answers for what does not exist (resource not found).
GONE: Final = -32002


class Scripted(FakeUpstream):
    """A FakeUpstream answering ``tools/list`` as ``mode`` says: ``ok`` (public, ``TTL_MS``),
    ``private``, ``html503``, ``garbage200``, ``rpc_error`` (HTTP 500 with a JSON-RPC error),
    ``gone`` (a :data:`GONE` error with HTTP ``gone_status``), ``gone_sse`` (that error as an
    SSE event, HTTP 200), ``big`` (a public list of about 5000 bytes), ``hang`` (never in time)."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "ok"
        self.delay_s = 0.0
        self.gone_status = 200
        self.handlers["tools/list"] = self.tools_list

    async def tools_list(self, request: web.Request, msg: Any) -> web.StreamResponse:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        mode = self.mode
        if mode == "hang":
            await asyncio.sleep(30)
        if mode == "html503":
            return web.Response(status=503, text="<html>down for maintenance</html>", content_type="text/html")
        if mode == "garbage200":
            return web.Response(status=200, text="<html>a captive portal</html>", content_type="text/html")
        if mode == "rpc_error":
            error = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": "backend down"}}
            return web.json_response(error, status=500)
        gone = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": GONE, "message": "no such list"}}
        if mode == "gone":
            return web.json_response(gone, status=self.gone_status)
        if mode == "gone_sse":
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
            await stream.write(sse_frame(gone))
            await stream.write_eof()
            return stream
        if mode == "big":
            answer = list_result(msg["id"], "public", TTL_MS)
            answer["result"]["tools"][0]["description"] = "x" * 5_000
            return web.json_response(answer)
        return web.json_response(list_result(msg["id"], "private" if mode == "private" else "public", TTL_MS))


async def serve(aiohttp_server: Any) -> tuple[Scripted, TestServer]:
    upstream = Scripted()
    server: TestServer = await aiohttp_server(upstream.app())
    upstream.url = str(server.make_url("/mcp"))
    return upstream, server


async def call(http: aiohttp.ClientSession, gw: RunningGateway, id_: object = 1, **params: Any) -> Reply:
    async with http.post(
        gw.url("up"), json=rpc("tools/list", id_=id_, **params), headers=mcp_headers("tools/list")
    ) as r:
        return r.status, r.headers.get("Cache-Status", ""), await r.json()


def config(upstream: FakeUpstream, **up: Any) -> dict[str, Any]:
    return {
        "admin": {"token": ADMIN},
        "cache": {"stale_if_error_ms": STALE_MS},
        "upstreams": {"up": {"url": upstream.url, "timeout_s": 0.3, **up}},
    }


def sample(gw: RunningGateway, name: str, **labels: str) -> float:
    return gw.registry.get_sample_value(name, labels) or 0.0


async def refreshes_done(gw: RunningGateway) -> None:
    tasks = gw.app[PROXY].readthrough.refreshes
    for _ in range(500):
        if not len(tasks):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("a refresh did not end")


StartEnv = Callable[..., Awaitable[tuple[Scripted, TestServer, RunningGateway]]]


@pytest.fixture
def start_env(aiohttp_server: Any, start_gateway: StartGateway, fake_clock: FakeClock) -> StartEnv:
    async def start(**up: Any) -> tuple[Scripted, TestServer, RunningGateway]:
        upstream, server = await serve(aiohttp_server)
        overrides = up.pop("config", {})
        gw = await start_gateway({**config(upstream, **up), **overrides}, clock=fake_clock)
        return upstream, server, gw

    return start


def assert_stale(reply: Reply, id_: object, past_s: int) -> None:
    status, cache_status, body = reply
    assert status == 200, reply
    assert body["id"] == id_
    assert body["result"]["ttlMs"] == 0
    assert body["result"]["tools"][0]["name"] == "t"
    assert cache_status == f"mcp-gateway; hit; ttl=-{past_s}"


# -- stale-if-error ------------------------------------------------------------------------------------


async def test_refused_upstream_after_expiry_is_answered_stale_within_the_window_and_with_its_error_beyond(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    _, server, gw = await start_env()
    assert (await call(http, gw))[0] == 200
    await server.close()  # refused from now on
    fake_clock.advance(TTL_MS / 1000 + 2.5)
    assert_stale(await call(http, gw, id_="caller-7"), "caller-7", 3)
    assert sample(gw, "mcp_gateway_cache_lookups_total", upstream="up", method="tools/list", result="stale") == 1
    fake_clock.advance(STALE_MS / 1000)  # past the window
    status, cache_status, body = await call(http, gw, id_=8)
    assert (status, body["error"]["code"], body["id"]) == (502, -32603, 8)
    assert "detail=upstream-error" in cache_status


@pytest.mark.parametrize("mode", ["hang", "html503", "garbage200"])
async def test_a_failing_upstream_after_expiry_is_answered_stale(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock, mode: str
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw)
    upstream.mode = mode
    fake_clock.advance(TTL_MS / 1000 + 0.2)
    assert_stale(await call(http, gw, id_=42), 42, 1)
    assert upstream.count("tools/list") == 2


async def test_a_busy_upstream_after_expiry_is_answered_stale_and_asked_again_as_soon_as_it_is_free(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    # At max_inflight the gateway does not ask the upstream: the same as a failure to fetch for
    # the answer (the stale entry, as on /mcp), but no failure for the backoff.
    upstream, _, gw = await start_env(max_inflight=1)
    await call(http, gw)
    release = asyncio.Event()

    async def hang(request: web.Request, msg: Any) -> web.StreamResponse:
        await release.wait()
        answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [], "resultType": "complete"}}
        return web.json_response(answer)

    upstream.handlers["tools/call"] = hang
    fake_clock.advance(TTL_MS / 1000 + 0.2)
    held = asyncio.create_task(
        http.post(gw.url("up"), json=rpc("tools/call", name="slow"), headers=mcp_headers("tools/call", name="slow"))
    )
    await wait_until(lambda: upstream.count("tools/call") > 0, limit_s=5, what="the held call at the upstream")
    assert_stale(await call(http, gw, id_="busy"), "busy", 1)
    release.set()
    (await held).release()
    status, cache_status, _ = await call(http, gw, id_=3)
    assert status == 200 and "fwd=miss" in cache_status  # asked again: no backoff after busy
    assert upstream.count("tools/list") == 2


async def test_callers_waiting_on_a_leader_whose_caller_hung_up_share_one_attempt_and_its_stale_answer(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    # The leader's caller goes away while the failing upstream is slow: its handler is
    # cancelled before any answer. The callers that waited on it read the key again, one of
    # them leading: one more attempt, and its stale answer for all, not one attempt each.
    upstream, _, gw = await start_env()
    await call(http, gw)
    fake_clock.advance(TTL_MS / 1000 + 0.2)
    upstream.mode, upstream.delay_s = "garbage200", 0.5
    joined = Followers(gw)
    leader = asyncio.create_task(call(http, gw, id_="leader"))
    await wait_until(lambda: upstream.count("tools/list") == 2, limit_s=5, what="the leader's request at the upstream")
    followers = [asyncio.create_task(call(http, gw, id_=f"f{i}")) for i in range(3)]
    # They wait on the leader (the upstream takes 0.5 s to answer it).
    await wait_until(lambda: joined.waiting() == 3, limit_s=5, what="the 3 callers waiting on the leader")
    leader.cancel()  # its connection closes: the gateway cancels its handler
    statuses = []
    for i, (status, cache_status, body) in enumerate(await asyncio.gather(*followers)):
        assert_stale((status, cache_status.removesuffix("; collapsed"), body), f"f{i}", 1)
        statuses.append(cache_status)
    assert sum(s.endswith("; collapsed") for s in statuses) == 2  # two waited on the third
    assert upstream.count("tools/list") == 3  # the first store, the leader's, one for the three


@pytest.mark.parametrize("mode", ["html503", "hang"])
async def test_a_failing_upstream_beyond_the_window_gives_its_error(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock, mode: str
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw)
    upstream.mode = mode
    fake_clock.advance((TTL_MS + STALE_MS) / 1000 + 0.001)
    status, _, body = await call(http, gw, id_=5)
    assert (status, body["error"]["code"]) == ({"html503": 502, "hang": 504}[mode], -32603)


async def test_a_jsonrpc_error_answer_is_relayed_not_replaced_by_the_stale_entry(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw)
    upstream.mode = "rpc_error"
    fake_clock.advance(TTL_MS / 1000 + 1)
    status, cache_status, body = await call(http, gw, id_=3)
    assert (status, body["error"]["message"], body["id"]) == (500, "backend down", 3)
    assert "hit" not in cache_status


@pytest.mark.parametrize("http_status", [200, 404, 500])
async def test_an_upstream_that_answered_gone_is_not_answered_stale_for_in_its_next_outage(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock, http_status: int
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw)
    upstream.mode, upstream.gone_status = "gone", http_status
    fake_clock.advance(TTL_MS / 1000 + 1)  # expired, kept for its stale window
    status, cache_status, body = await call(http, gw, id_=3)
    assert (status, body["error"]["code"], body["id"]) == (http_status, GONE, 3)  # relayed
    assert "hit" not in cache_status
    upstream.mode = "html503"  # then an outage: the upstream's last word was "gone"
    status, cache_status, body = await call(http, gw, id_=4)
    assert status == 502, f"answered stale after the upstream said it is gone: {cache_status}"
    assert (body["error"]["code"], body["id"]) == (-32603, 4)
    assert "detail=upstream-error" in cache_status
    assert upstream.count("tools/list") == 3


async def test_an_upstream_that_answered_gone_in_an_event_stream_is_not_answered_stale_for_after(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw)
    upstream.mode = "gone_sse"
    fake_clock.advance(TTL_MS / 1000 + 1)
    async with http.post(gw.url("up"), json=rpc("tools/list", id_=3), headers=mcp_headers("tools/list")) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        (answer,) = sse_messages(await r.read())
    assert (answer["id"], answer["error"]["code"]) == (3, GONE)
    upstream.mode = "html503"
    status, cache_status, _ = await call(http, gw, id_=4)
    assert status == 502, cache_status


async def test_an_answer_too_large_to_store_ends_the_older_entrys_stale_window(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(config={"cache": {"stale_if_error_ms": STALE_MS, "max_entry_bytes": 2_000}})
    assert "stored" in (await call(http, gw))[1]
    upstream.mode = "big"
    fake_clock.advance(TTL_MS / 1000 + 1)
    status, cache_status, _ = await call(http, gw)
    assert status == 200 and "detail=too-large" in cache_status
    upstream.mode = "html503"
    status, cache_status, _ = await call(http, gw)
    assert status == 502, cache_status


async def test_an_answer_refused_because_a_purge_crossed_it_ends_the_older_entrys_stale_window(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw)
    fake_clock.advance(TTL_MS / 1000 + 1)  # expired, kept
    upstream.delay_s = 0.2
    in_flight = asyncio.create_task(call(http, gw, id_="crossed"))
    await wait_until(lambda: upstream.count("tools/list") == 2, limit_s=5, what="the request at the upstream")
    # A purge of the upstream's prompts: it may be what the answer on its way is about (so the
    # answer is not stored), and it leaves the tools/list entry where it was.
    gw.app[REGISTRY].purge(invalidation("up", "notifications/prompts/list_changed", {}), "notification")
    status, cache_status, _ = await in_flight
    assert status == 200 and "detail=refused" in cache_status
    upstream.mode, upstream.delay_s = "html503", 0.0
    status, cache_status, _ = await call(http, gw)
    assert status == 502, f"the entry older than the refused answer came back: {cache_status}"


async def test_a_refresh_answered_gone_ends_the_entrys_stale_window(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(refresh_ahead=True)
    await call(http, gw)
    upstream.mode = "gone"
    fake_clock.advance(9.5)
    assert "hit; ttl=0" in (await call(http, gw))[1]  # starts the refresh, answered "gone"
    await refreshes_done(gw)
    upstream.mode = "html503"
    fake_clock.advance(0.6)  # expired, well inside the window it would have had
    status, cache_status, body = await call(http, gw, id_=7)
    assert (status, body["id"]) == (502, 7), cache_status
    assert upstream.count("tools/list") == 3  # the store, the refresh, this miss


async def test_without_stale_if_error_an_expired_entry_is_never_served(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(stale_if_error_ms=0)  # the upstream's override of [cache]
    await call(http, gw)
    upstream.mode = "html503"
    fake_clock.advance(TTL_MS / 1000 + 1)
    assert (await call(http, gw))[0] == 502


async def test_a_private_answer_is_never_served_stale(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env()
    upstream.mode = "private"
    await call(http, gw, cursor="p")
    upstream.mode = "html503"
    fake_clock.advance(TTL_MS / 1000 + 1)
    assert (await call(http, gw, cursor="p"))[0] == 502
    # A public entry whose upstream answers private once it expired is not kept for failures.
    upstream.mode = "ok"
    await call(http, gw)
    fake_clock.advance(TTL_MS / 1000 + 1)
    upstream.mode = "private"
    assert "private" in (await call(http, gw))[1]
    upstream.mode = "html503"
    fake_clock.advance(2)  # past the backoff
    assert (await call(http, gw))[0] == 502


async def test_a_purged_or_notified_entry_is_never_served_stale(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw, cursor="purged")
    await call(http, gw, cursor="notified")
    fake_clock.advance(TTL_MS / 1000 + 1)  # both expired, both kept
    assert gw.app[PROXY].store.stale(gw.app[PROXY].store.keys()[0]) is not None
    gw.app[REGISTRY].purge(invalidation("up", "notifications/tools/list_changed", {}), "notification")
    upstream.mode = "html503"
    assert (await call(http, gw, cursor="notified"))[0] == 502
    # And through the admin route, on a fresh entry:
    upstream.mode = "ok"
    await call(http, gw, cursor="purged")
    fake_clock.advance(TTL_MS / 1000 + 1)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with http.post(f"{gw.base_url}/admin/cache/purge?upstream=up", headers=headers) as r:
        assert (await r.json())["purged"] == 1
    upstream.mode = "html503"
    fake_clock.advance(2)
    assert (await call(http, gw, cursor="purged"))[0] == 502


async def test_fifty_concurrent_callers_on_a_failing_key_make_one_upstream_attempt(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env()
    await call(http, gw)
    upstream.mode, upstream.delay_s = "html503", 0.1  # slow to fail: every caller arrives meanwhile
    fake_clock.advance(TTL_MS / 1000 + 1)
    replies = await asyncio.gather(*(call(http, gw, id_=i) for i in range(50)))
    assert upstream.count("tools/list") == 2  # the first store, then one attempt
    for i, (status, cache_status, body) in enumerate(replies):
        assert (status, body["id"], body["result"]["ttlMs"]) == (200, i, 0)
        assert cache_status.startswith("mcp-gateway; hit; ttl=-1")
    assert sum("collapsed" in r[1] for r in replies) == 49
    # Backing off: the next callers are answered stale without the upstream being asked.
    upstream.delay_s = 0.0
    for i in range(10):
        assert (await call(http, gw, id_=i))[0] == 200
    assert upstream.count("tools/list") == 2
    fake_clock.advance(1.0)  # the backoff (1 s) is over: one more attempt, then 2 s
    for _ in range(3):
        assert (await call(http, gw))[0] == 200
    assert upstream.count("tools/list") == 3
    upstream.mode = "ok"  # the upstream is back: the first call after the backoff stores again
    fake_clock.advance(2.0)
    status, cache_status, _ = await call(http, gw)
    assert "stored" in cache_status
    assert "hit; ttl=10" in (await call(http, gw))[1]


# -- refresh-ahead ---------------------------------------------------------------------------------------


async def test_a_key_in_steady_demand_is_refreshed_ahead_and_never_misses(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(refresh_ahead=True)
    replies = []
    for _ in range(20 * 5 * TTL_MS // 1000):  # 20 a second across five lifetimes
        replies.append(await call(http, gw))
        fake_clock.advance(0.05)
        await asyncio.sleep(0)
    assert "stored" in replies[0][1]
    assert all(r[0] == 200 and r[1].startswith("mcp-gateway; hit; ttl=") for r in replies[1:])
    assert not any("ttl=-" in r[1] for r in replies)
    # Refreshed 1 s before expiry (the last 10% of 10 s): one request per 9 s.
    requests = upstream.count("tools/list")
    assert 5 <= requests <= 7, requests
    await refreshes_done(gw)
    stored = sample(gw, "mcp_gateway_cache_refreshes_total", upstream="up", method="tools/list", outcome="stored")
    assert stored == requests - 1
    # Traffic stops: no more refreshes, the entry just expires.
    fake_clock.advance(60)
    await asyncio.sleep(0.05)  # a window for a refresh that must not start: no state to poll for an absence
    assert upstream.count("tools/list") == requests
    assert "fwd=miss" in (await call(http, gw))[1]


async def test_a_hit_outside_the_refresh_window_does_not_refresh(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(refresh_ahead=True)
    await call(http, gw)
    fake_clock.advance(8.9)  # the window opens 1 s before expiry
    await call(http, gw)
    await refreshes_done(gw)
    assert upstream.count("tools/list") == 1
    fake_clock.advance(0.2)
    await asyncio.gather(*(call(http, gw) for _ in range(20)))
    await refreshes_done(gw)
    assert upstream.count("tools/list") == 2  # one refresh for twenty hits


async def test_a_failed_refresh_leaves_the_entry_and_backs_off(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(refresh_ahead=True, stale_if_error_ms=0)
    await call(http, gw)
    upstream.mode = "html503"
    fake_clock.advance(9.0)
    for _ in range(19):  # the last second of the entry's life, 20 hits
        status, cache_status, _ = await call(http, gw)
        assert (status, cache_status.split(";")[1].strip()) == (200, "hit")
        await refreshes_done(gw)
        fake_clock.advance(0.05)
    # Tried at 9.0 s, backed off 1 s: not again before the entry expired.
    assert upstream.count("tools/list") == 2
    failed = sample(gw, "mcp_gateway_cache_refreshes_total", upstream="up", method="tools/list", outcome="failed")
    assert failed == 1
    fake_clock.advance(0.1)
    assert (await call(http, gw))[0] == 502  # expired, no stale window: the upstream's error


async def test_a_refresh_with_stale_if_error_keeps_serving_through_an_outage(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(refresh_ahead=True)
    await call(http, gw)
    upstream.mode = "hang"
    fake_clock.advance(9.5)
    assert "hit; ttl=0" in (await call(http, gw))[1]
    await refreshes_done(gw)
    fake_clock.advance(0.8)  # expired; the refresh failed at 9.5 s: backing off until 10.5 s
    assert_stale(await call(http, gw, id_=9), 9, 1)
    assert upstream.count("tools/list") == 2


# -- the hot path answers as the plain one ------------------------------------------------------------


async def test_hot_and_plain_paths_answer_alike_through_stale_answers_and_refreshes(
    aiohttp_server: Any, aiohttp_client: Any, fake_clock: FakeClock
) -> None:
    upstream, _ = await serve(aiohttp_server)
    cfg = parse_config(
        {**config(upstream, refresh_ahead=True), "registry": {"enabled": False}},
        env={},
    )
    clients = [
        await aiohttp_client(await aiohttp_server(create_app(cfg, clock=fake_clock, hot_path=hot)))
        for hot in (True, False)
    ]
    # (seconds to advance, upstream mode, cursor): fresh hits, refreshes, stale answers, errors.
    script = [(0.0, "ok", None), (5.0, "ok", None), (4.5, "ok", None), (0.2, "ok", "a"), (9.4, "html503", None)]
    script += [(0.3, "html503", None), (0.5, "html503", "a"), (1.2, "rpc_error", None), (3.0, "garbage200", None)]
    script += [(0.0, "ok", "a"), (40.0, "html503", None), (0.0, "private", "b"), (0.0, "ok", None)]
    seen = []
    for step, (advance_s, mode, cursor) in enumerate(script):
        fake_clock.advance(advance_s)
        upstream.mode = mode
        params = {} if cursor is None else {"cursor": cursor}
        answers = []
        for client in clients:
            async with client.post(
                "/servers/up/mcp", json=rpc("tools/list", id_=step, **params), headers=mcp_headers("tools/list")
            ) as r:
                answers.append((r.status, [(k, v) for k, v in r.headers.items() if k != "Date"], await r.read()))
            refreshes = client.server.app[PROXY].readthrough.refreshes
            await wait_until(lambda tasks=refreshes: not len(tasks), limit_s=5, what="the refresh ended")
        assert answers[0] == answers[1], (step, answers)
        seen.append(dict(answers[0][1])["Cache-Status"])
    assert seen == EXPECTED_STATUSES


#: What the script above makes happen, step by step (the refreshes at steps 2 and 4 are seen in
#: the later steps: a fresh entry at 5 and a backoff at 5; the JSON-RPC error at 7 ends the
#: stale window that would have answered 8).
EXPECTED_STATUSES: Final = [
    "mcp-gateway; fwd=miss; fwd-status=200; stored; ttl=10",
    "mcp-gateway; hit; ttl=5",
    "mcp-gateway; hit; ttl=0",  # in the last second: refreshed (stored at 9.5 s)
    "mcp-gateway; fwd=miss; fwd-status=200; stored; ttl=10",
    "mcp-gateway; hit; ttl=0",  # the refresh fails (503): the entry stays, the key backs off
    "mcp-gateway; hit; ttl=0",
    "mcp-gateway; hit; ttl=-1",  # cursor a expired, the upstream down: stale
    "mcp-gateway; fwd=miss; fwd-status=500; detail=status",  # a JSON-RPC error: relayed, ends the stale window
    "mcp-gateway; fwd=miss; fwd-status=200; detail=upstream-error",  # no JSON-RPC answer, and nothing stale left
    "mcp-gateway; fwd=miss; fwd-status=200; stored; ttl=10",
    "mcp-gateway; fwd=miss; fwd-status=503; detail=upstream-error",  # past the stale window
    "mcp-gateway; fwd=miss; fwd-status=200; detail=private",
    "mcp-gateway; fwd=miss; fwd-status=200; stored; ttl=10",
]


async def test_a_refresh_answered_with_a_jsonrpc_error_never_makes_a_miss_answer_stale(
    start_env: StartEnv, http: aiohttp.ClientSession, fake_clock: FakeClock
) -> None:
    upstream, _, gw = await start_env(refresh_ahead=True)
    await call(http, gw)
    upstream.mode = "rpc_error"  # the upstream answers, with an error: an answer, not a failure
    fake_clock.advance(9.5)
    assert "hit; ttl=0" in (await call(http, gw))[1]  # starts the refresh
    await refreshes_done(gw)
    unstored = sample(gw, "mcp_gateway_cache_refreshes_total", upstream="up", method="tools/list", outcome="unstored")
    assert unstored == 1
    fake_clock.advance(0.6)  # expired, well inside the stale window
    status, cache_status, body = await call(http, gw, id_=7)
    assert (status, body["id"], body["error"]["message"]) == (500, 7, "backend down")
    assert "ttl=-" not in cache_status  # relayed, not stale
    assert upstream.count("tools/list") == 3  # the store, the refresh, this miss


async def test_callers_waiting_on_a_failing_key_without_a_stale_entry_share_its_failure(
    start_env: StartEnv, http: aiohttp.ClientSession
) -> None:
    upstream, _, gw = await start_env(stale_if_error_ms=0)
    upstream.mode, upstream.delay_s = "html503", 0.1  # slow to fail: every caller arrives meanwhile
    replies = await asyncio.gather(*(call(http, gw, id_=i) for i in range(50)))
    assert upstream.count("tools/list") == 1  # one attempt, not fifty
    for i, (status, _, body) in enumerate(replies):
        assert (status, body["id"], body["error"]["code"]) == (502, i, -32603)
