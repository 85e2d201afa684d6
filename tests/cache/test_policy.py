"""The storability decision and cache entries (gateway.cache.policy): every condition, and how a
stored answer is served (the caller's id, the remaining ttlMs, the ceiling)."""

from __future__ import annotations

import orjson
import pytest

from gateway.cache import STORED, build_entry, store_outcome

from ..support import FakeClock
from ..support.cache import result

# -- storability: every condition -------------------------------------------------------


def test_public_complete_positive_ttl_result_is_stored() -> None:
    assert store_outcome(200, result(), 100, 1000) == STORED


@pytest.mark.parametrize(
    ("status", "message", "size", "expected"),
    [
        (201, result(), 10, "status"),
        (400, result(), 10, "status"),
        (200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "x"}}, 10, "error"),
        (200, {"jsonrpc": "2.0", "id": 1, "result": []}, 10, "error"),
        (200, ["x"], 10, "error"),
        (200, result(resultType="input_required"), 10, "input_required"),
        (200, result(resultType=None), 10, "input_required"),
        (200, result(cacheScope="private"), 10, "private"),
        (200, result(cacheScope=None), 10, "private"),
        (200, result(cacheScope="Public"), 10, "private"),
        (200, result(ttlMs=0), 10, "no_ttl"),
        (200, result(ttlMs=-5), 10, "no_ttl"),
        (200, result(ttlMs=None), 10, "no_ttl"),
        (200, result(ttlMs=1.5), 10, "no_ttl"),
        (200, result(ttlMs="60000"), 10, "no_ttl"),
        (200, result(ttlMs=True), 10, "no_ttl"),
        (200, result(), 1001, "too_large"),
    ],
)
def test_each_storability_condition_refuses(status: int, message: object, size: int, expected: str) -> None:
    assert store_outcome(status, message, size, 1000) == expected


# -- entries: id and ttlMs rewrite, ceiling ---------------------------------------------------


def test_hit_carries_the_callers_id_and_the_remaining_ttl() -> None:
    clock = FakeClock()
    entry = build_entry(result(), clock(), max_ttl_ms=3_600_000)
    assert entry is not None
    clock.advance(12.5)
    for caller_id in (7, "req-7", 0):
        msg = orjson.loads(entry.response(orjson.dumps(caller_id), clock()))
        assert msg["id"] == caller_id
        assert msg["result"]["ttlMs"] == 47_500
        assert msg["result"]["tools"] == [{"name": "a"}]
        assert msg["result"]["cacheScope"] == "public"


def test_remaining_ttl_floors_at_zero() -> None:
    entry = build_entry(result(ttlMs=1000), 0.0, 3_600_000)
    assert entry is not None
    assert entry.remaining_ms(5.0) == 0


def test_max_ttl_is_a_ceiling_not_a_floor() -> None:
    long = build_entry(result(ttlMs=10_000_000), 0.0, max_ttl_ms=60_000)
    short = build_entry(result(ttlMs=5_000), 0.0, max_ttl_ms=60_000)
    assert long is not None and short is not None
    assert (long.ttl_ms, long.expires_at) == (60_000, 60.0)
    assert (short.ttl_ms, short.expires_at) == (5_000, 5.0)
    assert orjson.loads(long.response(b"1", 0.0))["result"]["ttlMs"] == 60_000


def test_entry_keeps_a_ttl_lookalike_string_inside_the_result_intact() -> None:
    msg = result(tools=[{"name": "ttlMs", "description": '"ttlMs": 5'}])
    entry = build_entry(msg, 0.0, 3_600_000)
    assert entry is not None
    assert orjson.loads(entry.response(b"1", 1.0))["result"]["tools"] == msg["result"]["tools"]


def test_refresh_ahead_starts_in_the_last_tenth_of_a_lifetime_or_its_last_second() -> None:
    for ttl_ms, window_s in ((60_000, 6.0), (10_000, 1.0), (1_000, 0.5), (3_600_000, 360.0)):
        entry = build_entry(result(ttlMs=ttl_ms), 0.0, 3_600_000, refresh_ahead=True)
        assert entry is not None
        assert entry.refresh_at == pytest.approx(ttl_ms / 1000 - window_s)
    plain = build_entry(result(), 0.0, 3_600_000)
    assert plain is not None and plain.refresh_at == float("inf") and plain.keep_until == plain.expires_at


def test_a_stale_answer_carries_ttl_zero_and_the_seconds_past_expiry_rounded_up() -> None:
    entry = build_entry(result(ttlMs=1000), 0.0, 3_600_000, stale_if_error_ms=10_000)
    assert entry is not None and entry.keep_until == 11.0
    body, past = entry.stale(b'"c"', 1.0001)
    assert past == 1 and orjson.loads(body) == {**result(ttlMs=0), "id": "c"}
    assert entry.stale(b"1", 3.5)[1] == 3
