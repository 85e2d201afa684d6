"""The read-through (gateway.cache.readthrough), without a socket: a miss's way to its answer,
with a scripted fetch in place of the upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.cache import Cached, CacheLookup, Lead, MemoryStore, ReadThrough, StoreOutcome
from gateway.config import parse_config
from gateway.errors import BadGateway, GatewayTimeout, Overloaded
from gateway.telemetry import GatewayMetrics

from ..support.cache import key, result
from ..support.clock import FakeClock


def through(clock: FakeClock, *, stale_if_error_ms: int = 0) -> ReadThrough:
    upstream = {"url": "http://127.0.0.1:9/mcp", "stale_if_error_ms": stale_if_error_ms}
    config = parse_config({"upstreams": {"up": upstream}})
    store = MemoryStore(max_entries=100, max_bytes=1 << 20, clock=clock, keep_stale=stale_if_error_ms > 0)
    metrics = GatewayMetrics(CollectorRegistry())
    return ReadThrough(config, store, metrics, clock, failures=(BadGateway, GatewayTimeout), busy=(Overloaded,))


def stored(rt: ReadThrough, answer: dict[str, Any]) -> Any:
    """A fetch that keeps ``answer`` and returns what its lead kept."""

    async def fetch(lead: Lead) -> tuple[StoreOutcome, Any]:
        return lead.keep(200, answer, 100, "tools/list")

    return fetch


async def test_concurrent_misses_make_one_fetch_and_the_others_answer_from_its_entry(fake_clock: FakeClock) -> None:
    rt = through(fake_clock)
    started = asyncio.Event()
    release = asyncio.Event()
    fetches = 0

    async def fetch(lead: Lead) -> str:
        nonlocal fetches
        fetches += 1
        started.set()
        await release.wait()
        lead.keep(200, result(), 100, "tools/list")
        return "fetched"

    k = key()
    first = asyncio.create_task(rt.read(k, fetch, timeout_s=1, request_id=1))
    await started.wait()
    others = [asyncio.create_task(rt.read(k, fetch, timeout_s=1, request_id=i)) for i in range(2, 5)]
    release.set()
    assert await first == "fetched"
    got = await asyncio.gather(*others)
    assert fetches == 1
    assert all(isinstance(g, Cached) and g.lookup is CacheLookup.COALESCED for g in got)
    assert rt.store.get(k) is not None


async def test_a_follower_answers_the_leaders_failure_with_its_own_request_id(fake_clock: FakeClock) -> None:
    rt = through(fake_clock)
    started = asyncio.Event()
    release = asyncio.Event()

    async def fetch(lead: Lead) -> str:
        started.set()
        await release.wait()
        raise BadGateway("upstream up refused", request_id=1)

    k = key()
    leader = asyncio.create_task(rt.read(k, fetch, timeout_s=1, request_id=1))
    await started.wait()
    follower = asyncio.create_task(rt.read(k, fetch, timeout_s=1, request_id="mine"))
    await asyncio.sleep(0)  # the follower waits on the leader
    release.set()
    with pytest.raises(BadGateway) as led:
        await leader
    with pytest.raises(BadGateway) as followed:
        await follower
    assert led.value.request_id == 1 and followed.value.request_id == "mine"
    assert followed.value.message == "upstream up refused"


async def test_a_failed_fetch_answers_from_the_stale_entry_and_then_backs_off(fake_clock: FakeClock) -> None:
    rt = through(fake_clock, stale_if_error_ms=60_000)
    k = key()
    await rt.read(k, stored(rt, result(ttlMs=1_000)), timeout_s=1, request_id=1)
    fake_clock.advance(2)  # expired, kept for stale-if-error
    asked = 0

    async def failing(lead: Lead) -> str:
        nonlocal asked
        asked += 1
        raise GatewayTimeout("no answer")

    got = await rt.read(k, failing, timeout_s=1, request_id=2)
    assert isinstance(got, Cached) and got.lookup is CacheLookup.STALE
    again = await rt.read(k, failing, timeout_s=1, request_id=3)  # backing off: not asked again
    assert isinstance(again, Cached) and again.stale and asked == 1


async def test_a_busy_upstream_answers_from_the_stale_entry_without_backing_off(fake_clock: FakeClock) -> None:
    rt = through(fake_clock, stale_if_error_ms=60_000)
    k = key()
    await rt.read(k, stored(rt, result(ttlMs=1_000)), timeout_s=1, request_id=1)
    fake_clock.advance(2)

    async def busy(lead: Lead) -> str:
        raise Overloaded("at max_inflight")

    got = await rt.read(k, busy, timeout_s=1, request_id=2)
    assert isinstance(got, Cached) and got.stale
    assert not rt.backoff.waiting(k, fake_clock())  # busy is no failure
    assert await rt.read(k, stored(rt, result()), timeout_s=1, request_id=3) == (StoreOutcome.STORED, rt.store.get(k))


async def test_an_answer_that_is_not_stored_ends_the_stale_window(fake_clock: FakeClock) -> None:
    rt = through(fake_clock, stale_if_error_ms=60_000)
    k = key()
    await rt.read(k, stored(rt, result(ttlMs=1_000)), timeout_s=1, request_id=1)
    fake_clock.advance(2)
    outcome, entry = await rt.read(k, stored(rt, result(cacheScope="private")), timeout_s=1, request_id=2)
    assert outcome is StoreOutcome.PRIVATE and entry is None
    assert rt.store.stale(k) is None  # the upstream's newest word: no older entry answers for it


async def test_an_answer_that_crosses_a_purge_is_not_stored(fake_clock: FakeClock) -> None:
    rt = through(fake_clock)
    k = key()

    async def purged_meanwhile(lead: Lead) -> tuple[StoreOutcome, Any]:
        rt.store.purge(lambda _key: True, "purge")
        return lead.keep(200, result(), 100, "tools/list")

    outcome, entry = await rt.read(k, purged_meanwhile, timeout_s=1, request_id=1)
    assert outcome is StoreOutcome.REFUSED and entry is None and rt.store.get(k) is None


async def test_a_refresh_leads_its_key_and_a_miss_meanwhile_waits_for_it(fake_clock: FakeClock) -> None:
    rt = through(fake_clock)
    k = key()
    release = asyncio.Event()

    async def refetch() -> tuple[int, Any, int]:
        await release.wait()
        return 200, result(tools=[{"name": "new"}]), 100

    assert rt.refresh(k, refetch, timeout_s=1, method="tools/list")
    assert not rt.refresh(k, refetch, timeout_s=1, method="tools/list")  # one under way

    async def never(lead: Lead) -> str:
        raise AssertionError("a miss during a refresh waits for it")

    waiting = asyncio.create_task(rt.read(k, never, timeout_s=1, request_id=2))
    await asyncio.sleep(0)
    release.set()
    got = await waiting
    assert isinstance(got, Cached) and got.collapsed
    await rt.close()
