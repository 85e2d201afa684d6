"""The metrics (gateway.telemetry.metrics): the batched request metrics give the same samples as
prometheus_client's Counter and Histogram would expose; the cache-size gauges read the store."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cache import MemoryStore, build_entry
from gateway.telemetry import GatewayMetrics, RequestMetrics

from ..support.cache import key, result
from ..support.clock import FakeClock
from ..support.telemetry import cache_sizes, record


def test_request_metrics_match_prometheus_client_counter_and_histogram() -> None:
    """The batched collector exposes the same samples as Counter/Histogram would."""
    ours_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    ours = RequestMetrics("mcp_gateway", ours_registry, (0.001, 0.01, 0.1))
    requests = Counter(
        "requests",
        "Requests answered on MCP routes, by HTTP status.",
        ["upstream", "method", "status"],
        namespace="mcp_gateway",
        registry=reference_registry,
    )
    durations = Histogram(
        "request_duration_seconds",
        "Time to answer an MCP request (to the last byte), in seconds.",
        ["upstream", "method", "cache"],
        namespace="mcp_gateway",
        registry=reference_registry,
        buckets=(0.001, 0.01, 0.1),
    )
    observations = [("up", "tools/list", 200, "hit", "hit", s) for s in (0.0005, 0.001, 0.002, 0.01, 5.0)]
    observations += [("up", "tools/call", 502, "bypass", None, 0.3)] * 3
    records = []
    for upstream, method, status, cache, lookup, seconds in observations:
        records.append(record((upstream, method, "POST", status, None, cache, None, seconds), lookup))
        requests.labels(upstream, method, str(status)).inc()
        durations.labels(upstream, method, cache).observe(seconds)
    upstream_durations = Histogram(
        "upstream_request_duration_seconds",
        "Time an upstream took to answer, in seconds.",
        ["upstream", "method"],
        namespace="mcp_gateway",
        registry=reference_registry,
        buckets=(0.001, 0.01, 0.1),
    )
    for i, r in enumerate(records):
        if r.status == 502 or i % 2:  # forwarded
            records[i] = r._replace(upstream_seconds=r.seconds / 3)
            upstream_durations.labels(r.upstream, r.method).observe(r.seconds / 3)
    ours.add(records[:4])  # in two batches
    ours.add(records[4:])

    def samples(registry: CollectorRegistry, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith(prefix) and not s.name.endswith("_created")
        }

    prefixes = ("mcp_gateway_requests", "mcp_gateway_request_duration_seconds", "mcp_gateway_upstream_request")
    for prefix in prefixes:
        assert samples(ours_registry, prefix) == pytest.approx(samples(reference_registry, prefix))
    assert ours.requests("up", "tools/list", 200) == 5
    assert ours.lookups("up", "tools/list", "hit") == 5
    assert ours.lookups("up", "tools/call", "bypass") == 0  # the cache was not asked


def test_request_metrics_add_up_batches_of_many_kinds() -> None:
    """Many kinds of request in one batch, each summed apart."""
    registry = CollectorRegistry()
    ours = RequestMetrics("mcp_gateway", registry, (0.001, 0.01))
    reference = Histogram(
        "d", "d", ["upstream", "method", "cache"], registry=CollectorRegistry(), buckets=(0.001, 0.01)
    )
    records = [
        record((f"up{i % 11}", "tools/list", "POST", 200, None, "hit", None, i / 7000), "hit") for i in range(300)
    ]
    ours.add(records)
    for r in records:
        reference.labels(r.upstream, r.method, r.cache).observe(r.seconds)
    for i in range(11):
        series = ours._durations[(f"up{i}", "tools/list", "hit")]
        assert series[-1] == pytest.approx(reference.labels(f"up{i}", "tools/list", "hit")._sum.get())
        assert sum(series[:-1]) == len([r for r in records if r.upstream == f"up{i}"])


def test_cache_size_gauges_read_the_store_at_scrape_time() -> None:
    """Stores, expiry and purges show in the next scrape with nothing setting the gauges."""
    clock = FakeClock()
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    store = MemoryStore(max_entries=10, max_bytes=100_000, clock=clock, on_evict=metrics.evicted)
    metrics.track_store(store)
    assert cache_sizes(registry) == (0, 0)
    entry = build_entry(result(), clock(), 3_600_000)
    assert entry is not None
    assert store.put(key(), entry) and store.put(key(cursor="p2"), entry)
    assert cache_sizes(registry) == (2, 2 * entry.size)
    assert store.purge(lambda k: k == key(), "purge") == 1
    assert cache_sizes(registry) == (1, entry.size)
    clock.advance(61)  # past the entry's ttlMs of 60 s
    assert cache_sizes(registry) == (0, 0)
    assert registry.get_sample_value("mcp_gateway_cache_evictions_total", {"reason": "expired"}) == 1
