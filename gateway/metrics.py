"""Prometheus metrics of the gateway, created against an injected ``CollectorRegistry``.

Label values come only from configured upstream names, known MCP method names (else
``other``) and fixed outcome sets; never ids, tool names, URIs or tokens.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["FOLD_EVERY", "GatewayMetrics", "RequestMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: How many finished requests are recorded before they are added up (also done on scrape).
FOLD_EVERY: Final = 256


class RequestMetrics:
    """The metrics updated by every MCP request, recorded in batches (a prometheus_client
    custom collector).

    Families (README "Metrics"): ``mcp_gateway_requests_total{upstream,method,status}``,
    ``mcp_gateway_request_duration_seconds{upstream,method,cache}`` (a histogram, seconds) and
    ``mcp_gateway_cache_lookups_total{upstream,method,result}``.

    Why not ``Counter``/``Histogram``: each of their updates takes a lock and a histogram
    walks its bounds in Python, together a sizeable part of answering a cache hit (bench/).
    :meth:`record` only appends a tuple; every ``FOLD_EVERY`` records, and before every
    scrape, :meth:`fold` adds them up in one tight loop. A scrape therefore always sees every
    request recorded before it. The families are rendered by prometheus_client
    (``CounterMetricFamily``/``HistogramMetricFamily``: the same samples, ``le`` formatting
    and ``_created`` series for the counters). Single-threaded: record from the event loop.
    """

    def __init__(self, namespace: str, registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        self._ns = namespace
        self._bounds = tuple(sorted(buckets))
        self._le = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._pending: list[tuple[str, str, int, str, str | None, float]] = []
        self._requests: dict[tuple[str, str, str], int] = {}
        self._requests_created: dict[tuple[str, str, str], float] = {}
        self._lookups: dict[tuple[str, str, str], int] = {}
        self._lookups_created: dict[tuple[str, str, str], float] = {}
        #: (upstream, method, cache) -> [count per bucket..., count above every bound, sum]
        self._durations: dict[tuple[str, str, str], list[float]] = {}
        registry.register(self)

    def record(self, upstream: str, method: str, status: int, cache: str, lookup: str | None, seconds: float) -> None:
        """One answered request: its HTTP ``status``, ``cache`` label (hit/miss/bypass), cache
        ``lookup`` result (hit/miss/coalesced/bypass, ``None`` when the cache was not asked)
        and duration in ``seconds``."""
        pending = self._pending
        pending.append((upstream, method, status, cache, lookup, seconds))
        if len(pending) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Add up the recorded requests."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        now = time.time()
        requests, lookups, durations, bounds = self._requests, self._lookups, self._durations, self._bounds
        for upstream, method, status, cache, lookup, seconds in pending:
            key = (upstream, method, str(status))
            if key in requests:
                requests[key] += 1
            else:
                requests[key] = 1
                self._requests_created[key] = now
            if lookup is not None:
                key = (upstream, method, lookup)
                if key in lookups:
                    lookups[key] += 1
                else:
                    lookups[key] = 1
                    self._lookups_created[key] = now
            key = (upstream, method, cache)
            series = durations.get(key)
            if series is None:
                series = durations[key] = [0.0] * (len(bounds) + 2)
            # le is inclusive: bisect_left puts a value equal to a bound in that bound's bucket.
            series[bisect_left(bounds, seconds)] += 1
            series[-1] += seconds

    def requests(self, upstream: str, method: str, status: int) -> int:
        """``mcp_gateway_requests_total`` of one series (after folding)."""
        self.fold()
        return self._requests.get((upstream, method, str(status)), 0)

    def lookups(self, upstream: str, method: str, result: str) -> int:
        """``mcp_gateway_cache_lookups_total`` of one series (after folding)."""
        self.fold()
        return self._lookups.get((upstream, method, result), 0)

    def _families(self) -> tuple[CounterMetricFamily, HistogramMetricFamily, CounterMetricFamily]:
        ns = self._ns
        return (
            CounterMetricFamily(
                f"{ns}_requests",
                "Requests answered on MCP routes, by HTTP status.",
                labels=("upstream", "method", "status"),
            ),
            HistogramMetricFamily(
                f"{ns}_request_duration_seconds",
                "Time to answer an MCP request (to the last byte), in seconds.",
                labels=("upstream", "method", "cache"),
            ),
            CounterMetricFamily(
                f"{ns}_cache_lookups",
                "Cache lookups by result: hit, miss, coalesced, bypass.",
                labels=("upstream", "method", "result"),
            ),
        )

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        self.fold()
        requests, durations, lookups = self._families()
        for key, count in self._requests.items():
            requests.add_metric(key, count, created=self._requests_created[key])
        for key, count in self._lookups.items():
            lookups.add_metric(key, count, created=self._lookups_created[key])
        for key, series in self._durations.items():
            cumulative, buckets = 0.0, []
            for le, in_bucket in zip(self._le, series[:-1], strict=True):
                cumulative += in_bucket
                buckets.append((le, cumulative))
            durations.add_metric(key, buckets, sum_value=series[-1])
        yield requests
        yield durations
        yield lookups


class GatewayMetrics:
    """Every metric the gateway exports (README "Metrics")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        ns = "mcp_gateway"
        # The three families every request updates, cache hits included: batched (see class).
        self.request_metrics = RequestMetrics(ns, registry, _LATENCY_BUCKETS)
        self.cache_stores = Counter(
            "cache_stores",
            "Upstream answers to cacheable requests: stored, or why not.",
            ["upstream", "method", "outcome"],
            namespace=ns,
            registry=registry,
        )
        self.cache_evictions = Counter(
            "cache_evictions",
            "Cache entries removed, by reason.",
            ["reason"],
            namespace=ns,
            registry=registry,
        )
        self.cache_entries = Gauge("cache_entries", "Entries in the cache.", namespace=ns, registry=registry)
        self.cache_bytes = Gauge("cache_bytes", "Bytes of results in the cache.", namespace=ns, registry=registry)
        self.upstream_request_duration = Histogram(
            "upstream_request_duration_seconds",
            "Time an upstream took to answer, in seconds.",
            ["upstream", "method"],
            namespace=ns,
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.upstream_up = Gauge(
            "upstream_up",
            "1 when the last probe of the upstream succeeded.",
            ["upstream"],
            namespace=ns,
            registry=registry,
        )
        self.upstream_supported_version = Gauge(
            "upstream_supported_version",
            "1 for each protocol version the upstream advertises.",
            ["upstream", "version"],
            namespace=ns,
            registry=registry,
        )
        self.inflight = Gauge(
            "inflight_requests",
            "Requests being forwarded to the upstream now.",
            ["upstream"],
            namespace=ns,
            registry=registry,
        )

    def evicted(self, reason: str, count: int) -> None:
        """Count ``count`` evictions for ``reason``."""
        self.cache_evictions.labels(reason).inc(count)
