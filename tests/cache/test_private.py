"""Private answers per identity (gateway/cache/private.py): kept for one authorization context,
never past the token's ``exp``, at most 256 a context, and only complete private results."""

from __future__ import annotations

from gateway.cache import MemoryStore
from gateway.cache.private import MAX_PRIVATE_PER_CONTEXT, PrivateAnswers

from ..support import FakeClock
from ..support.cache import key, result

ALICE, BOB = b"a" * 32, b"b" * 32
WALL = 1_800_000_000.0


def answers(clock: FakeClock, **opts: int) -> tuple[MemoryStore, PrivateAnswers]:
    store = MemoryStore(max_entries=opts.pop("max_entries", 10_000), max_bytes=10_000_000, clock=clock)
    return store, PrivateAnswers(store, clock, max_entry_bytes=4096, max_ttl_ms=3_600_000, wall=lambda: WALL)


def test_a_private_answer_is_kept_for_its_context_alone() -> None:
    clock = FakeClock()
    store, private = answers(clock)
    k = key()
    assert private.keep(k, ALICE, None, 200, result(cacheScope="private"), 100) is not None
    assert store.get(k) is None and store.get(PrivateAnswers.key(k, BOB)) is None
    assert store.get(PrivateAnswers.key(k, ALICE)) is not None
    clock.advance(60)
    assert store.get(PrivateAnswers.key(k, ALICE)) is None  # ttlMs 60000


def test_a_private_answer_never_outlives_the_token() -> None:
    clock = FakeClock()
    store, private = answers(clock)
    k = key()
    entry = private.keep(k, ALICE, WALL + 5, 200, result(cacheScope="private"), 100)
    assert entry is not None and entry.expires_at == clock() + 5
    clock.advance(5)
    assert store.get(PrivateAnswers.key(k, ALICE)) is None
    assert private.keep(k, BOB, WALL - 1, 200, result(cacheScope="private"), 100) is None


def test_only_complete_private_results_with_a_ttl_are_kept_and_never_without_a_context() -> None:
    clock = FakeClock()
    _, private = answers(clock)
    k = key()
    for message, status in [
        (result(cacheScope="public"), 200),
        (result(cacheScope="private", ttlMs=None), 200),
        (result(cacheScope="private", resultType="input_required"), 200),
        (result(cacheScope="private"), 500),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "x"}}, 200),
    ]:
        assert private.keep(k, ALICE, None, status, message, 100) is None
    assert private.keep(k, b"", None, 200, result(cacheScope="private"), 100) is None
    assert private.keep(k, ALICE, None, 200, result(cacheScope="private"), 5000) is None  # over max_entry_bytes


def test_a_context_holds_at_most_256_entries_the_oldest_going_first() -> None:
    clock = FakeClock()
    store, private = answers(clock)
    keys = [key(cursor=str(n)) for n in range(MAX_PRIVATE_PER_CONTEXT + 10)]
    for k in keys:
        assert private.keep(k, ALICE, None, 200, result(cacheScope="private"), 100) is not None
    assert private.keep(keys[0], BOB, None, 200, result(cacheScope="private"), 100) is not None
    held = [k for k in keys if store.get(PrivateAnswers.key(k, ALICE)) is not None]
    assert held == keys[10:]
    assert store.get(PrivateAnswers.key(keys[0], BOB)) is not None
    assert store.purges == 0  # made room without a purge: fetches under way still store
