"""Cache keys, the storability decision, entries, the store and coalescing (gateway.cache)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from multidict import CIMultiDict

from gateway.cache import (
    STORED,
    CacheKey,
    Coalescer,
    MemoryStore,
    build_entry,
    make_key,
    store_outcome,
)
from gateway.protocol import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, parse_request

V = "2026-07-28"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def request(method: str = "tools/list", caps: object = None, id_: object = 1, **params: Any) -> Any:
    meta: dict[str, Any] = {PROTOCOL_VERSION_KEY: V, CLIENT_CAPABILITIES_KEY: {} if caps is None else caps}
    meta.update(params.pop("_extra_meta", {}))
    raw = orjson.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": {"_meta": meta, **params}})
    h = CIMultiDict({"MCP-Protocol-Version": V, "Mcp-Method": method})
    if method == "resources/read":
        h["Mcp-Name"] = params["uri"]
    return parse_request(raw, h)


def result(**overrides: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"tools": [{"name": "a"}], "resultType": "complete", "cacheScope": "public", "ttlMs": 60000}
    res.update(overrides)
    return {"jsonrpc": "2.0", "id": 1, "result": {k: v for k, v in res.items() if v is not None}}


def key(**kw: Any) -> CacheKey:
    return make_key("up", request(**kw), vary_on_capabilities=True)


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


# -- keys: every component ------------------------------------------------------------------


def test_key_ignores_id_client_info_progress_token_and_trace_context() -> None:
    base = key()
    assert key(id_="other") == base
    extra = {
        "io.modelcontextprotocol/clientInfo": {"name": "x", "version": "9"},
        "progressToken": "p1",
        "traceparent": "00-abc-def-01",
        "tracestate": "a=b",
        "baggage": "k=v",
        "io.modelcontextprotocol/logLevel": "debug",
    }
    assert key(_extra_meta=extra) == base


def test_key_separates_upstream_method_params_version_and_capabilities() -> None:
    base = make_key("up", request(), vary_on_capabilities=True)
    assert make_key("other", request(), vary_on_capabilities=True) != base
    assert key(method="prompts/list") != base
    assert key(cursor="c2") != base
    assert key(cursor="") != base  # an empty cursor is a valid cursor, not "no cursor"
    assert key(caps={"elicitation": {}}) != base
    assert key(method="resources/read", uri="a://1") != key(method="resources/read", uri="a://2")
    other_version = request()
    object.__setattr__(other_version, "version", "2027-01-01")
    assert make_key("up", other_version, vary_on_capabilities=True) != base


def test_capabilities_are_keyed_canonically_and_can_be_disabled() -> None:
    a = key(caps={"elicitation": {"form": {}}, "roots": {}})
    b = key(caps={"roots": {}, "elicitation": {"form": {}}})
    assert a == b
    off = make_key("up", request(caps={"elicitation": {}}), vary_on_capabilities=False)
    assert off == make_key("up", request(caps={}), vary_on_capabilities=False)
    assert off.capabilities is None


def test_param_order_does_not_change_the_key() -> None:
    r1 = parse_request(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"x","_meta":{"'
        + PROTOCOL_VERSION_KEY.encode()
        + b'":"2026-07-28","'
        + CLIENT_CAPABILITIES_KEY.encode()
        + b'":{}},"z":1}}',
        CIMultiDict({"MCP-Protocol-Version": V, "Mcp-Method": "tools/list"}),
    )
    r2 = request(cursor="x", z=1)
    assert make_key("up", r1, vary_on_capabilities=True) == make_key("up", r2, vary_on_capabilities=True)


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


# -- the store --------------------------------------------------------------------------


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


# -- coalescing -------------------------------------------------------------------------


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
