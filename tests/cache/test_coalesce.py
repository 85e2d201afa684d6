"""Coalescing (gateway.cache.coalesce): one upstream request per cold key, its followers answered
from the leader's entry."""

from __future__ import annotations

import asyncio

from gateway.cache import Coalescer, Stale, build_entry

from ..support.cache import key, result


async def test_coalescer_gives_followers_the_leaders_entry() -> None:
    co = Coalescer()
    k = key()
    assert co.claim(k) is None
    followers = [co.claim(k) for _ in range(3)]
    assert all(f is not None for f in followers)
    entry = build_entry(result(), 0.0, 3_600_000)
    co.release(k, entry)
    assert [await f for f in followers if f is not None] == [entry] * 3
    assert len(co) == 0
    assert co.claim(k) is None  # the next miss leads again


async def test_coalescer_tells_followers_to_go_on_their_own_when_not_storable() -> None:
    co = Coalescer()
    k = key()
    assert co.claim(k) is None
    fut = co.claim(k)
    assert fut is not None
    co.release(k, None)
    assert await asyncio.wait_for(fut, 1) is None


async def test_coalescer_hands_followers_a_stale_entry_when_the_leader_failed() -> None:
    co = Coalescer()
    k = key()
    assert co.claim(k) is None
    fut = co.claim(k)
    assert fut is not None
    entry = build_entry(result(), 0.0, 3_600_000)
    assert entry is not None
    co.release(k, Stale(entry))
    assert await asyncio.wait_for(fut, 1) == Stale(entry)
