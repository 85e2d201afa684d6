"""Listen streams (gateway.registry.listen): what each notification purges (pure), streams
against scripted upstreams, and real SDK upstreams changing at run time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.cache import invalidation
from gateway.registry import (
    LISTEN_RESYNC_S,
    RESUBSCRIBE_AFTER_GRACEFUL_S,
)

from ..support.clock import FakeTime
from ..support.fleet import Upstream, add_tool, bump_resource
from ..support.polling import wait_until
from ..support.scripted_mcp import ScriptedMcp
from ..support.telemetry import cache_sizes
from .harness import (
    FAST,
    LIST_CHANGED,
    Gateway,
    Servers,
    key,
    listening,
    mcp,
    probed,
    start_gateway,
)

pytestmark = pytest.mark.timeout(60)


# -- invalidation (pure) ---------------------------------------------------------------------------------


def test_each_notification_purges_only_what_it_makes_stale() -> None:
    keys = [
        key("a", "tools/list"),
        key("a", "tools/list", cursor="p2"),
        key("a", "prompts/list"),
        key("a", "resources/list"),
        key("a", "resources/templates/list"),
        key("a", "resources/read", uri="res://x"),
        key("a", "resources/read", uri="res://x/child"),
        key("a", "resources/read", uri="res://xy"),
        key("a", "server/discover"),
        key("b", "tools/list"),
        key("b", "resources/read", uri="res://x"),
    ]

    def purged(method: str, **params: Any) -> list[tuple[str, str, bytes]]:
        predicate = invalidation("a", method, params)
        assert predicate is not None
        return [(k.upstream, k.method, k.params) for k in keys if predicate(k)]

    assert purged("notifications/tools/list_changed") == [
        ("a", "tools/list", b"{}"),
        ("a", "tools/list", b'{"cursor":"p2"}'),
    ]
    assert purged("notifications/prompts/list_changed") == [("a", "prompts/list", b"{}")]
    assert [m for _, m, _ in purged("notifications/resources/list_changed")] == [
        "resources/list",
        "resources/templates/list",
    ]
    assert purged("notifications/resources/updated", uri="res://x") == [
        ("a", "resources/read", b'{"uri":"res://x"}'),
        ("a", "resources/read", b'{"uri":"res://x/child"}'),
    ]
    assert invalidation("a", "notifications/message", {}) is None
    assert invalidation("a", "notifications/resources/updated", {}) is None


# -- listen streams against scripted upstreams ------------------------------------------------------------------


async def fill_cache(http: aiohttp.ClientSession, gw: Gateway, name: str) -> None:
    for method in ("tools/list", "prompts/list"):
        await mcp(http, gw.url(name), method)
    await mcp(http, gw.url(name), "resources/read", {"uri": "res://a"})


async def test_list_changed_notification_purges_that_list_of_that_upstream_only(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    one = ScriptedMcp(capabilities=LIST_CHANGED)
    two = ScriptedMcp(capabilities=LIST_CHANGED)
    gw = await start_gateway(servers, {"one": await servers.upstream(one), "two": await servers.upstream(two)}, FAST)
    await wait_until(lambda: listening(gw, "one") and listening(gw, "two"), what="listen streams")
    assert one.listens[0].filter == {"toolsListChanged": True, "promptsListChanged": True}
    await fill_cache(http, gw, "one")
    await fill_cache(http, gw, "two")
    one.listens[-1].notify("notifications/tools/list_changed")
    await wait_until(lambda: not any(k.method == "tools/list" for k in gw.keys("one")), what="the purge")
    assert sorted(k.method for k in gw.keys("one")) == ["prompts/list", "resources/read"]
    assert len(gw.keys("two")) == 3
    assert gw.metric("mcp_gateway_cache_evictions_total", reason="notification") == 1
    await mcp(http, gw.url("one"), "tools/list")
    assert one.count("tools/list") == 2


async def test_a_list_changed_notification_shows_in_the_cache_size_gauges_without_a_push(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST)
    await wait_until(lambda: listening(gw, "s"), what="a listen stream")
    await fill_cache(http, gw, "s")
    assert cache_sizes(gw.metrics) == (3, gw.store.total_bytes)
    scripted.listens[-1].notify("notifications/tools/list_changed")
    await wait_until(lambda: cache_sizes(gw.metrics)[0] == 2, what="the purge in the entries gauge")
    assert cache_sizes(gw.metrics) == (len(gw.store), gw.store.total_bytes)


async def test_listen_stream_ended_without_the_result_purges_the_upstream_and_resubscribes(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    other = ScriptedMcp(capabilities=LIST_CHANGED)
    upstreams = {"s": await servers.upstream(scripted), "other": await servers.upstream(other)}
    gw = await start_gateway(servers, upstreams, FAST)
    await wait_until(lambda: listening(gw, "s") and listening(gw, "other"), what="listen streams")
    await fill_cache(http, gw, "s")
    await fill_cache(http, gw, "other")
    assert len(gw.keys("s")) == 3
    scripted.new_listen.clear()
    scripted.listens[-1].end(graceful=False)
    await wait_until(lambda: gw.keys("s") == [], what="the stream_lost purge")
    assert gw.metric("mcp_gateway_cache_evictions_total", reason="stream_lost") == 3
    assert len(gw.keys("other")) == 3
    await asyncio.wait_for(scripted.new_listen.wait(), 5)  # re-subscribed
    await wait_until(lambda: listening(gw, "s"), what="the new stream's acknowledgement")
    assert len(scripted.listens) == 2 and gw.state.upstreams["s"].listen.losses == 1
    assert gw.state.upstreams["s"].health == ("up", None)


async def test_entries_stored_while_the_stream_is_down_are_purged_when_it_is_back(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST)
    await wait_until(lambda: listening(gw, "s"), what="a listen stream")

    async def refuse(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=503)

    scripted.handlers["subscriptions/listen"] = refuse
    scripted.listens[-1].end(graceful=False)
    refused = scripted.count("subscriptions/listen") + 1
    await wait_until(lambda: scripted.count("subscriptions/listen") > refused, what="refused re-subscriptions")
    await fill_cache(http, gw, "s")  # stored during the gap: no notification could reach us
    assert len(gw.keys("s")) == 3 and gw.state.upstreams["s"].health[0] == "degraded"
    del scripted.handlers["subscriptions/listen"]
    await wait_until(lambda: listening(gw, "s"), what="the stream back")
    assert gw.keys("s") == []
    assert gw.state.upstreams["s"].health == ("up", None)


async def test_graceful_listen_end_keeps_the_entries_and_resubscribes(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    fake = FakeTime()
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST, sleep=fake.sleep, clock=fake)
    await wait_until(lambda: listening(gw, "s"), what="a listen stream")
    await fill_cache(http, gw, "s")
    scripted.new_listen.clear()
    scripted.listens[-1].end(graceful=True)
    await fake.asleep(RESUBSCRIBE_AFTER_GRACEFUL_S)  # the pause before re-subscribing
    fake.advance(RESUBSCRIBE_AFTER_GRACEFUL_S)
    await asyncio.wait_for(scripted.new_listen.wait(), 5)
    assert len(gw.keys("s")) == 3
    assert gw.state.upstreams["s"].listen.losses == 0


async def test_a_stream_that_does_not_start_with_the_acknowledgement_is_refused_and_degrades_health(
    servers: Servers,
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    scripted.ack_first = False
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST)
    await wait_until(lambda: len(scripted.listens) >= 2, what="a retry")
    state = gw.state.upstreams["s"]
    assert state.listen.state in ("retrying", "connecting") and state.listen.losses == 0
    health, reason = state.health
    assert health == "degraded" and reason is not None and "acknowledgement" in reason
    assert state.up  # still counted: it answers, only invalidation is TTL-bound
    scripted.ack_first = True
    await wait_until(lambda: listening(gw, "s"), what="an acknowledged stream")
    assert state.health == ("up", None)


async def test_resource_updates_are_subscribed_for_cached_uris_without_a_gap(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities={"resources": {"subscribe": True}})
    fake = FakeTime()
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST, sleep=fake.sleep, clock=fake)
    await wait_until(lambda: probed(gw, "s"), what="a probe")
    assert scripted.listens == []  # subscribe advertised, but nothing cached to listen for yet
    await mcp(http, gw.url("s"), "resources/read", {"uri": "res://a"})
    await mcp(http, gw.url("s"), "resources/read", {"uri": "res://b"})
    await fake.asleep(LISTEN_RESYNC_S)  # until the listen stream's next look at the cache
    fake.advance(LISTEN_RESYNC_S)
    await wait_until(lambda: listening(gw, "s"), what="a stream for the cached URIs")
    first = scripted.listens[-1]
    assert first.filter == {"resourceSubscriptions": ["res://a", "res://b"]}
    await mcp(http, gw.url("s"), "resources/read", {"uri": "res://c"})
    await fake.asleep(LISTEN_RESYNC_S)
    fake.advance(LISTEN_RESYNC_S)
    await wait_until(lambda: len(scripted.listens) >= 2 and listening(gw, "s"), what="a wider stream")
    await asyncio.wait_for(first.closed.wait(), 5)  # the old one is closed once the new one is acknowledged
    assert scripted.listens[-1].filter == {"resourceSubscriptions": ["res://a", "res://b", "res://c"]}
    assert len(gw.keys("s")) == 3  # replacing a stream is not a loss
    scripted.listens[-1].notify("notifications/resources/updated", uri="res://b")
    await wait_until(lambda: len(gw.keys("s")) == 2, what="the read of res://b purged")
    assert sorted(orjson.loads(k.params)["uri"] for k in gw.keys("s")) == ["res://a", "res://c"]


async def test_a_tool_added_at_run_time_shows_in_tools_list_through_the_gateway_long_before_the_ttl(
    servers: Servers, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    gw = await start_gateway(servers, {"chg": changing_up.url}, FAST)
    await wait_until(lambda: listening(gw, "chg"), what="the gateway's listen stream")
    honoured = gw.state.upstreams["chg"].listen.honoured
    assert honoured is not None and honoured["toolsListChanged"] is True
    first = await mcp(http, gw.url("chg"), "tools/list")
    assert first["result"]["ttlMs"] == 60_000
    names = {t["name"] for t in first["result"]["tools"]}
    added = (await add_tool(changing_up, "registry_test_tool"))["added"]
    assert added not in names
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def shows_new_tool() -> bool:
        listed = await mcp(http, gw.url("chg"), "tools/list")
        return added in {t["name"] for t in listed["result"]["tools"]}

    await wait_until(shows_new_tool, limit_s=5, what="the new tool through the gateway")
    assert loop.time() - started < 5  # the TTL is 60 s
    assert (gw.metric("mcp_gateway_cache_evictions_total", reason="notification") or 0) >= 1


async def test_resources_updated_from_a_real_upstream_purges_the_cached_read(
    servers: Servers, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    fake = FakeTime()
    gw = await start_gateway(servers, {"chg": changing_up.url}, FAST, sleep=fake.sleep, clock=fake)
    await wait_until(lambda: listening(gw, "chg"), what="the gateway's listen stream")
    before = await mcp(http, gw.url("chg"), "resources/read", {"uri": "res://counter"})
    value = before["result"]["contents"][0]["text"]
    await fake.asleep(LISTEN_RESYNC_S)  # until the listen stream's next look at the cache
    fake.advance(LISTEN_RESYNC_S)

    def subscribed() -> bool:
        listen = gw.state.upstreams["chg"].listen
        return listen.state == "acknowledged" and "res://counter" in (listen.honoured or {}).get(
            "resourceSubscriptions", []
        )

    await wait_until(subscribed, what="a listen stream subscribed to res://counter")
    cached = await mcp(http, gw.url("chg"), "resources/read", {"uri": "res://counter"})
    assert cached["result"]["contents"][0]["text"] == value
    bumped = await bump_resource(changing_up)
    await wait_until(lambda: not gw.keys("chg"), what="the purge of the cached read")
    after = await mcp(http, gw.url("chg"), "resources/read", {"uri": "res://counter"})
    assert after["result"]["contents"][0]["text"] == f"counter={bumped['value']}"
