"""Prometheus metrics of the gateway, created against an injected ``CollectorRegistry``.

Label values come only from configured upstream names, known MCP method names (else
``other``) and fixed outcome sets; never ids, tool names, URIs or tokens.
"""

from __future__ import annotations

import collections
import itertools
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from .record import RequestRecord

__all__ = ["GatewayMetrics", "RequestMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RequestMetrics:
    """The metrics updated by every MCP request, added up in batches (a prometheus_client
    custom collector).

    Families: ``mcp_gateway_requests_total{upstream,method,status}``,
    ``mcp_gateway_request_duration_seconds{upstream,method,cache}`` (a histogram, seconds),
    ``mcp_gateway_cache_lookups_total{upstream,method,result}`` and
    ``mcp_gateway_upstream_request_duration_seconds{upstream,method}`` (a histogram, seconds).

    Why not ``Counter``/``Histogram``: each of their updates takes a lock and a histogram
    walks its bounds in Python, together a sizeable part of answering a cache hit (bench/RESULTS.md).
    Requests come in batches of request records (:meth:`add`, from the journal), added up
    with C-level counting; ``before_collect`` (the journal's ``drain``) is called before every
    scrape, so a scrape sees every request that ended before it. The families are rendered
    by prometheus_client (``CounterMetricFamily``/``HistogramMetricFamily``: the same samples,
    ``le`` formatting and ``_created`` series for the counters). Single-threaded.
    """

    def __init__(self, namespace: str, registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        self._ns = namespace
        self._bounds = tuple(sorted(buckets))
        self._le = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._requests: dict[tuple[str, str, str], int] = {}
        self._requests_created: dict[tuple[str, str, str], float] = {}
        self._lookups: dict[tuple[str, str, str], int] = {}
        self._lookups_created: dict[tuple[str, str, str], float] = {}
        #: (upstream, method, cache) -> [count per bucket..., count above every bound, sum]
        self._durations: dict[tuple[str, str, str], list[float]] = {}
        #: (upstream, method) -> the same, for the time upstreams took
        self._upstream_durations: dict[tuple[str, str], list[float]] = {}
        #: Called first thing on every collect (and by :meth:`requests`/:meth:`lookups`).
        self.before_collect: Callable[[], None] | None = None
        registry.register(self)

    def add(self, records: Sequence[RequestRecord]) -> None:
        """Add up a batch of request records."""
        if not records:
            return
        now = time.time()
        # The batch as one record of columns: each field a tuple of every record's value.
        columns: Any = RequestRecord._make(zip(*records, strict=True))
        upstream, method, status, cache = columns.upstream, columns.method, columns.status, columns.cache
        seconds, lookup = columns.seconds, columns.lookup
        # le is inclusive: bisect_left puts a value equal to a bound in that bound's bucket.
        buckets = map(bisect_left, itertools.repeat(self._bounds), seconds)
        # One C-level count of every kind of request in the batch (a batch holds few kinds),
        # then the three families from those counts.
        kinds = collections.Counter(zip(upstream, method, status, cache, lookup, buckets, strict=True))
        requests, lookups, durations = self._requests, self._lookups, self._durations
        width = len(self._bounds) + 2
        for (u, m, code, c, result, bucket), count in kinds.items():
            key = (u, m, str(code))
            if key in requests:
                requests[key] += count
            else:
                requests[key] = count
                self._requests_created[key] = now
            if result is not None:
                key = (u, m, result)
                if key in lookups:
                    lookups[key] += count
                else:
                    lookups[key] = count
                    self._lookups_created[key] = now
            series = durations.get((u, m, c))
            if series is None:
                series = durations[u, m, c] = [0.0] * width
            series[bucket] += count
        for key, total in _sums(list(zip(upstream, method, cache, strict=True)), seconds).items():
            durations[key][-1] += total
        forwarded = [(r.upstream, r.method, r.upstream_seconds) for r in records if r.upstream_seconds is not None]
        if forwarded:
            self._observe(
                self._upstream_durations, [(u, m) for u, m, _ in forwarded], [s for _, _, s in forwarded]
            )

    def _observe(self, store: dict[Any, list[float]], keys: list[Any], values: list[float]) -> None:
        """Histogram observations ``values`` (seconds) by label values ``keys``."""
        width = len(self._bounds) + 2
        buckets = map(bisect_left, itertools.repeat(self._bounds), values)
        for (key, bucket), count in collections.Counter(zip(keys, buckets, strict=True)).items():
            series = store.get(key)
            if series is None:
                series = store[key] = [0.0] * width
            series[bucket] += count
        for key, total in _sums(keys, values).items():
            store[key][-1] += total

    def requests(self, upstream: str, method: str, status: int) -> int:
        """``mcp_gateway_requests_total`` of one series (every request recorded so far)."""
        self._before_collect()
        return self._requests.get((upstream, method, str(status)), 0)

    def lookups(self, upstream: str, method: str, result: str) -> int:
        """``mcp_gateway_cache_lookups_total`` of one series (every request recorded so far)."""
        self._before_collect()
        return self._lookups.get((upstream, method, result), 0)

    def _families(
        self,
    ) -> tuple[CounterMetricFamily, HistogramMetricFamily, CounterMetricFamily, HistogramMetricFamily]:
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
            HistogramMetricFamily(
                f"{ns}_upstream_request_duration_seconds",
                "Time an upstream took to answer, in seconds.",
                labels=("upstream", "method"),
            ),
        )

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _before_collect(self) -> None:
        if self.before_collect is not None:
            self.before_collect()

    def collect(self) -> Iterator[Metric]:
        self._before_collect()
        requests, durations, lookups, upstream_durations = self._families()
        for key, count in self._requests.items():
            requests.add_metric(key, count, created=self._requests_created[key])
        for key, count in self._lookups.items():
            lookups.add_metric(key, count, created=self._lookups_created[key])
        for family, store in ((durations, self._durations), (upstream_durations, self._upstream_durations)):
            for labels, series in store.items():
                cumulative, buckets = 0.0, []
                for le, in_bucket in zip(self._le, series[:-1], strict=True):
                    cumulative += in_bucket
                    buckets.append((le, cumulative))
                family.add_metric(labels, buckets, sum_value=series[-1])
        yield requests
        yield durations
        yield lookups
        yield upstream_durations


def _sums(keys: list[Any], values: Sequence[float]) -> dict[Any, float]:
    """The sum of ``values`` by key."""
    sums: dict[Any, float] = {}
    for key, value in zip(keys, values, strict=True):
        sums[key] = sums.get(key, 0.0) + value
    return sums


class GatewayMetrics:
    """Every metric the gateway exports (README, "Metrics")."""

    def __init__(self, registry: CollectorRegistry, *, cluster: bool = False) -> None:
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
        # Read at scrape time from each Upstream's count (create_app binds them).
        self.inflight = Gauge(
            "inflight_requests",
            "Requests being forwarded to the upstream now.",
            ["upstream"],
            namespace=ns,
            registry=registry,
        )

        # The shared tier ([cluster]). cluster_up exists only with it: an alert on it being 0
        # must not fire for a gateway that has no shared tier.
        self.cluster_up = Gauge(
            "cluster_up",
            "1 while the shared tier (Redis) answers, 0 while the gateway serves without it.",
            namespace=ns,
            registry=registry if cluster else None,
        )
        self.cluster_errors = Counter(
            "cluster_errors",
            "Redis calls that failed, timed out or read back a corrupt value, by operation.",
            ["operation"],
            namespace=ns,
            registry=registry,
        )
        self.cluster_reads = Counter(
            "cluster_reads",
            "Shared-tier lookups after a local miss, by result (hit, miss, corrupt, error).",
            ["result"],
            namespace=ns,
            registry=registry,
        )
        self.cluster_leases = Gauge(
            "cluster_leases_held",
            "1 for each upstream this process probes and listens to for the cluster.",
            ["upstream"],
            namespace=ns,
            registry=registry,
        )

    def evicted(self, reason: str, count: int) -> None:
        """Count ``count`` evictions for ``reason``."""
        self.cache_evictions.labels(reason).inc(count)
