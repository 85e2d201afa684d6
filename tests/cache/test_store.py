"""The in-process store (gateway.cache.store): expiry at each entry's ttl, the entry and byte
bounds, and purges, each reported to the eviction listener."""

from __future__ import annotations

from typing import Any

from gateway.cache import Invalidation, MemoryStore, build_entry, make_key

from ..support import FakeClock
from ..support.cache import key, request, result


def make_store(clock: FakeClock, evictions: list[tuple[str, int]], **kw: Any) -> MemoryStore:
    opts = {"max_entries": 3, "max_bytes": 1 << 20}
    opts.update(kw)
    return MemoryStore(clock=clock, on_evict=lambda r, n: evictions.append((r, n)), **opts)


def test_store_expires_entries_at_their_ttl() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev)
    entry = build_entry(result(ttlMs=1000), clock(), 3_600_000)
    assert entry is not None and store.put(key(), entry)
    clock.advance(0.999)
    assert store.get(key()) is entry
    clock.advance(0.002)
    assert store.get(key()) is None
    assert ev == [("expired", 1)]
    assert len(store) == 0 and store.total_bytes == 0


def test_store_is_bounded_by_entry_count() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev)
    for i in range(5):
        entry = build_entry(result(), clock(), 3_600_000)
        assert entry is not None
        store.put(key(cursor=str(i)), entry)
    assert len(store) == 3
    assert store.get(key(cursor="0")) is None and store.get(key(cursor="4")) is not None
    assert sum(n for r, n in ev if r == "size") == 2


def test_store_is_bounded_by_total_bytes() -> None:
    clock, ev = FakeClock(), []
    entry = build_entry(result(), clock(), 3_600_000)
    assert entry is not None
    store = make_store(clock, ev, max_entries=100, max_bytes=entry.size * 2)
    for i in range(4):
        store.put(key(cursor=str(i)), entry)
    assert len(store) == 2 and store.total_bytes == entry.size * 2


def test_store_with_zero_entries_stores_nothing() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev, max_entries=0)
    entry = build_entry(result(), clock(), 3_600_000)
    assert entry is not None
    assert not store.put(key(), entry)
    assert store.get(key()) is None


def test_purge_removes_matching_entries_and_reports_them() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev, max_entries=10)
    entry = build_entry(result(), clock(), 3_600_000)
    assert entry is not None
    store.put(key(), entry)
    store.put(key(method="prompts/list"), entry)
    store.put(make_key("other", request(), vary_on_capabilities=True), entry)
    assert store.purge(lambda k: k.upstream == "up" and k.method == "tools/list", "notification") == 1
    assert store.purge(lambda k: k.upstream == "up", "purge") == 1
    assert len(store) == 1
    assert ev == [("notification", 1), ("purge", 1)]


# -- stale-if-error: entries kept past expiry -------------------------------------------------


def test_an_expired_entry_is_kept_for_its_stale_window_but_is_no_hit() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev, keep_stale=True)
    entry = build_entry(result(ttlMs=1000), clock(), 3_600_000, stale_if_error_ms=5000)
    assert entry is not None and store.put(key(), entry)
    assert store.get(key()) is entry and store.stale(key()) is None
    clock.advance(1.0)
    assert store.get(key()) is None and store.stale(key()) is entry
    assert len(store) == 1 and store.total_bytes == entry.size  # it still counts against max_bytes
    clock.advance(5.0)
    assert store.stale(key()) is None and len(store) == 0
    assert ev == [("expired", 1)]


def test_stale_entries_count_against_the_bounds_and_go_with_a_purge() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev, keep_stale=True)
    for i in range(3):
        entry = build_entry(result(ttlMs=1000), clock(), 3_600_000, stale_if_error_ms=60_000)
        assert entry is not None and store.put(key(cursor=str(i)), entry)
    clock.advance(2)
    fresh = build_entry(result(), clock(), 3_600_000, stale_if_error_ms=60_000)
    assert fresh is not None and store.put(key(cursor="new"), fresh)
    assert len(store) == 3 and store.stale(key(cursor="0")) is None  # the least recently used went
    assert store.purge(lambda k: True, "purge") == 3
    assert store.stale(key(cursor="1")) is None and store.purges == 1


def test_a_superseded_entry_loses_its_stale_window_and_its_refresh() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev, keep_stale=True)
    entry = build_entry(result(ttlMs=1000), clock(), 3_600_000, stale_if_error_ms=5000, refresh_ahead=True)
    assert entry is not None and store.put(key(), entry)
    store.supersede(key())
    kept = store.get(key())
    assert kept is not None and kept.keep_until == kept.expires_at and kept.refresh_at == float("inf")
    clock.advance(1.0)
    assert store.stale(key()) is None
    assert store.put(key(cursor="x"), entry) is False  # expired already: refused
    other = build_entry(result(ttlMs=1000), clock(), 3_600_000, stale_if_error_ms=5000)
    assert other is not None and store.put(key(cursor="x"), other)
    clock.advance(1.0)
    store.supersede(key(cursor="x"))  # expired: it goes now
    assert len(store) == 0 and ("superseded", 1) in ev


def test_a_purge_of_one_upstream_does_not_count_against_another() -> None:
    # A fetch started before a purge may not store its answer: only a purge that could have been
    # about its upstream (that one's, or everyone's) says so.
    store = MemoryStore(max_entries=10, max_bytes=10_000, clock=lambda: 0.0)
    a, b = store.purges_of("a"), store.purges_of("b")
    store.purge(Invalidation("a", ("tools/list",)), "notification")
    assert (store.purges_of("a"), store.purges_of("b")) == (a + 1, b)
    store.purge(Invalidation(), "purge")
    store.purge(lambda _key: True, "cluster")
    assert (store.purges_of("a"), store.purges_of("b")) == (a + 3, b + 2)


def test_shrinking_max_entries_evicts_the_least_recently_used_down_to_it_at_once() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev, max_entries=10)
    for i in range(6):
        entry = build_entry(result(), clock(), 3_600_000)
        assert entry is not None and store.put(key(cursor=str(i)), entry)
    assert store.get(key(cursor="0")) is not None  # now the most recently used
    assert store.resize(max_entries=2, max_bytes=1 << 20, keep_stale=False) == 4
    assert len(store) == 2
    assert store.get(key(cursor="0")) is not None and store.get(key(cursor="5")) is not None
    assert ev == [("size", 4)]


def test_shrinking_max_bytes_evicts_down_to_it_and_bounds_later_puts() -> None:
    clock, ev = FakeClock(), []
    entry = build_entry(result(), clock(), 3_600_000)
    assert entry is not None
    store = make_store(clock, ev, max_entries=100, max_bytes=entry.size * 10)
    for i in range(5):
        store.put(key(cursor=str(i)), entry)
    assert store.resize(max_entries=100, max_bytes=entry.size * 2, keep_stale=False) == 3
    assert store.total_bytes == entry.size * 2
    assert store.get(key(cursor="4")) is not None and store.get(key(cursor="0")) is None
    store.put(key(cursor="9"), entry)
    assert store.total_bytes == entry.size * 2


def test_a_store_resized_to_keep_stale_entries_answers_stale_after_expiry() -> None:
    clock, ev = FakeClock(), []
    store = make_store(clock, ev)
    store.resize(max_entries=3, max_bytes=1 << 20, keep_stale=True)
    entry = build_entry(result(ttlMs=1000), clock(), 3_600_000, stale_if_error_ms=5000)
    assert entry is not None and store.put(key(), entry)
    clock.advance(2)
    assert store.get(key()) is None and store.stale(key()) is entry
