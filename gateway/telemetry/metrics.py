"""Prometheus metrics of the gateway, created against an injected ``CollectorRegistry``.

Label values come only from configured upstream names, known MCP method names (else
``other``) and fixed outcome sets; never ids, tool names, URIs or tokens.

One process (``serve``, every ``create_app`` by default): each metric lives in the process and
is rendered from the registry; nothing here costs a request more than it did.

A process group (``serve --workers N``): prometheus_client's multiprocess mode, chosen by giving
:class:`GatewayMetrics` a :class:`~.group.MultiProcessRegistry` (see :mod:`.group`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import operator
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..tasks import BackgroundTasks
from .group import GAUGE_SAMPLE_S, GroupCollector, MultiProcessRegistry, SharedRequestSeries, ZeroOnRemoveGauge
from .record import RequestRecord

__all__ = ["GatewayMetrics", "RequestMetrics", "SizedStore"]


_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: The per-request families: name after the namespace, help, label names.
_REQUESTS = ("requests", "Requests answered on MCP routes, by HTTP status.", ("upstream", "method", "status"))
_DURATIONS = (
    "request_duration_seconds",
    "Time to answer an MCP request (to the last byte), in seconds.",
    ("upstream", "method", "cache"),
)
_LOOKUPS = (
    "cache_lookups",
    "Cache lookups by result: hit, shared (from the cluster's Redis), miss, coalesced, stale (an expired "
    "entry answered because the upstream failed), bypass.",
    ("upstream", "method", "result"),
)
_UPSTREAM_DURATIONS = (
    "upstream_request_duration_seconds",
    "Time an upstream took to answer, in seconds.",
    ("upstream", "method"),
)


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

    ``registry`` is where the collector is registered (``None``: nowhere). With ``shared``
    (multiprocess mode, see the module) every batch is also added to prometheus_client values
    in this process's multiprocess files, once per kind of request in it.
    """

    def __init__(
        self,
        namespace: str,
        registry: CollectorRegistry | None,
        buckets: Sequence[float],
        *,
        shared: bool = False,
    ) -> None:
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
        self._shared = (
            SharedRequestSeries(namespace, self._bounds, _REQUESTS, _LOOKUPS, _DURATIONS, _UPSTREAM_DURATIONS)
            if shared
            else None
        )
        if registry is not None:
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
        series_keys = {(u, m, c) for u, m, _, c, _, _ in kinds}
        if len(series_keys) == 1:  # the usual batch, all of one series: summed without a key per record
            sums = dict.fromkeys(series_keys, functools.reduce(operator.add, seconds, 0.0))
        else:
            sums = _sums(list(zip(upstream, method, cache, strict=True)), seconds)
        for key, total in sums.items():
            durations[key][-1] += total
        upstream_counts: dict[tuple[Any, int], int] = {}
        upstream_sums: dict[Any, float] = {}
        if columns.upstream_seconds.count(None) < len(records):  # some upstream was asked (not all hits)
            forwarded = [(r.upstream, r.method, r.upstream_seconds) for r in records if r.upstream_seconds is not None]
            upstream_counts, upstream_sums = self._observe(
                self._upstream_durations, [(u, m) for u, m, _ in forwarded], [s for _, _, s in forwarded]
            )
        if self._shared is not None:
            self._shared.add(kinds, sums, upstream_counts, upstream_sums)

    def _observe(
        self, store: dict[Any, list[float]], keys: list[Any], values: list[float]
    ) -> tuple[collections.Counter[tuple[Any, int]], dict[Any, float]]:
        """Histogram observations ``values`` (seconds) by label values ``keys``; returns the
        count of observations by (key, bucket index) and their sum by key."""
        width = len(self._bounds) + 2
        buckets = map(bisect_left, itertools.repeat(self._bounds), values)
        counts = collections.Counter(zip(keys, buckets, strict=True))
        for (key, bucket), count in counts.items():
            series = store.get(key)
            if series is None:
                series = store[key] = [0.0] * width
            series[bucket] += count
        sums = _sums(keys, values)
        for key, total in sums.items():
            store[key][-1] += total
        return counts, sums

    def upstream_request(self, upstream: str, method: str, seconds: float) -> None:
        """One request the gateway made of ``upstream`` that no caller's record carries (a part
        of an answer of ``POST /mcp``), into ``mcp_gateway_upstream_request_duration_seconds``."""
        counts, sums = self._observe(self._upstream_durations, [(upstream, method)], [seconds])
        if self._shared is not None:
            self._shared.add({}, {}, counts, sums)

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
            CounterMetricFamily(f"{ns}_{_REQUESTS[0]}", _REQUESTS[1], labels=_REQUESTS[2]),
            HistogramMetricFamily(f"{ns}_{_DURATIONS[0]}", _DURATIONS[1], labels=_DURATIONS[2]),
            CounterMetricFamily(f"{ns}_{_LOOKUPS[0]}", _LOOKUPS[1], labels=_LOOKUPS[2]),
            HistogramMetricFamily(
                f"{ns}_{_UPSTREAM_DURATIONS[0]}", _UPSTREAM_DURATIONS[1], labels=_UPSTREAM_DURATIONS[2]
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
    """The sum of ``values`` by key (each key's values added in order, from 0.0)."""
    sums: dict[Any, float] = {}
    for key, value in zip(keys, values, strict=True):
        sums[key] = sums.get(key, 0.0) + value
    return sums


class SizedStore(Protocol):
    """What :meth:`GatewayMetrics.track_store` reads of a cache store (``gateway.cache``, above
    this package, implements it)."""

    def __len__(self) -> int: ...

    @property
    def total_bytes(self) -> int: ...


class GatewayMetrics:
    """Every metric the gateway exports (docs/metrics.md).

    With a :class:`MultiProcessRegistry` the metrics are in multiprocess mode (see the module);
    with any other registry they live in this process, registered there.
    """

    def __init__(self, registry: CollectorRegistry, *, cluster: bool = False) -> None:
        self.registry = registry
        ns = "mcp_gateway"
        group = registry if isinstance(registry, MultiProcessRegistry) else None
        self._group = group
        #: The upstreams the config names (:meth:`serving`); ``None`` until it is told.
        self.upstreams: frozenset[str] | None = None
        # In a group the metrics register nowhere: every worker's values are read from the files.
        own = registry if group is None else None
        #: (gauge, read) of the gauges read from this process's state (track_inflight, track_store).
        self._sampled: list[tuple[Gauge, Callable[[], float]]] = []
        # The three families every request updates, cache hits included: batched (see class).
        self.request_metrics = RequestMetrics(ns, own, _LATENCY_BUCKETS, shared=group is not None)
        self.cache_stores = Counter(
            "cache_stores",
            "Upstream answers to cacheable requests: stored, or why not.",
            ["upstream", "method", "outcome"],
            namespace=ns,
            registry=own,
        )
        self.cache_refreshes = Counter(
            "cache_refreshes",
            "Background refreshes of entries in demand shortly before they expire (refresh-ahead), by "
            "outcome: stored, unstored (answered, not storable: the entry stays until it expires), failed, "
            "shared (another replica refreshed it: taken from Redis), skipped (another replica refreshes it).",
            ["upstream", "method", "outcome"],
            namespace=ns,
            registry=own,
        )
        self.aggregate_parts_missing = Counter(
            "aggregate_parts_missing",
            "Members of POST /mcp whose part an answer went without, by outcome: left_out (it failed; "
            "the answer was served without it) or cut_short (some of its pages were left out).",
            ["upstream", "method", "outcome"],
            namespace=ns,
            registry=own,
        )
        self.cache_evictions = Counter(
            "cache_evictions",
            "Cache entries removed, by reason.",
            ["reason"],
            namespace=ns,
            registry=own,
        )
        # multiprocess_mode only matters in a group (module docstring); one process ignores it.
        # Read from the store (create_app binds it: track_store).
        self.cache_entries = Gauge(
            "cache_entries", "Entries in the cache.", namespace=ns, registry=own, multiprocess_mode="livesum"
        )
        self.cache_bytes = Gauge(
            "cache_bytes", "Bytes of results in the cache.", namespace=ns, registry=own, multiprocess_mode="livesum"
        )
        self.upstream_up = Gauge(
            "upstream_up",
            "1 when the last probe of the upstream succeeded.",
            ["upstream"],
            namespace=ns,
            registry=own,
            multiprocess_mode="mostrecent",
        )
        self.upstream_supported_version = (Gauge if group is None else ZeroOnRemoveGauge)(
            "upstream_supported_version",
            "1 for each protocol version the upstream advertises.",
            ["upstream", "version"],
            namespace=ns,
            registry=own,
            multiprocess_mode="mostrecent",
        )
        self.callers_dropped = Counter(
            "listener_callers_dropped",
            "Callers whose connection the gateway dropped while writing an answer, by reason: "
            "write_timeout (it took no bytes for listener.write_timeout_s) or queue_full (no room under "
            "listener.max_queued_bytes within that time).",
            ["reason"],
            namespace=ns,
            registry=own,
        )
        # Read from each Upstream's count (create_app binds them: track_inflight).
        self.inflight = Gauge(
            "inflight_requests",
            "Requests being forwarded to the upstream now.",
            ["upstream"],
            namespace=ns,
            registry=own,
            multiprocess_mode="livesum",
        )
        # livemax in a group: 1 for each config some live worker serves; one no worker serves
        # any more reads 0 (removed series read 0: the files cannot drop one).
        self.config_info = (Gauge if group is None else ZeroOnRemoveGauge)(
            "config_info",
            "1 for the config this process serves, by the SHA-256 of its file's bytes.",
            ["sha256"],
            namespace=ns,
            registry=own,
            multiprocess_mode="livemax",
        )
        self.auth = Counter(
            "auth",
            "Caller authentications on the MCP and registry routes, by outcome: ok, missing (no bearer token), "
            "invalid, expired, insufficient_scope (lacks required scopes) or denied (refused by a policy rule).",
            ["outcome"],
            namespace=ns,
            registry=own,
        )
        self.config_reloads = Counter(
            "config_reloads",
            "Config reloads (SIGHUP, POST /admin/reload), by outcome: ok, or failed (nothing changed: the "
            "file was invalid, or this process cannot reload).",
            ["outcome"],
            namespace=ns,
            registry=own,
        )

        # The shared tier ([cluster]). cluster_up exists only with it: an alert on it being 0
        # must not fire for a gateway that has no shared tier.
        self.cluster_up = Gauge(
            "cluster_up",
            "1 while the shared tier (Redis) answers and takes writes, 0 while the gateway serves without it "
            "(Redis down, or refusing writes: then nothing is cached until it takes them again).",
            namespace=ns,
            registry=own if cluster else None,
            multiprocess_mode="livemin",
        )
        self.cluster_invalidations_pending = Gauge(
            "cluster_invalidations_pending",
            "Invalidations (purges, list_changed notifications, lost listen streams) this process could "
            "not write to the shared tier yet; sent again until Redis takes them.",
            namespace=ns,
            registry=own if cluster else None,
            multiprocess_mode="livesum",
        )
        self.cluster_errors = Counter(
            "cluster_errors",
            "Redis calls that failed, timed out or read back a corrupt value, by operation.",
            ["operation"],
            namespace=ns,
            registry=own,
        )
        self.cluster_reads = Counter(
            "cluster_reads",
            "Shared-tier lookups after a local miss, by result (hit, miss, forged: MAC wrong, corrupt: not a "
            "valid entry, error).",
            ["result"],
            namespace=ns,
            registry=own,
        )
        self.cluster_leases = Gauge(
            "cluster_leases_held",
            "1 for each upstream this process probes and listens to for the cluster.",
            ["upstream"],
            namespace=ns,
            registry=own,
            multiprocess_mode="livesum",
        )
        if group is not None:
            # A labelless gauge has a value in the files from its creation: cluster_up would
            # read 0 without [cluster].
            hidden = () if cluster else (f"{ns}_cluster_up", f"{ns}_cluster_invalidations_pending")
            # The files cannot drop a series: an upstream a reload removed would read on (up 0,
            # firing MCPGatewayUpstreamDown for good). Its gauges are left out of a scrape instead.
            per_upstream = {f"{ns}_{name}" for name in ("upstream_up", "inflight_requests", "cluster_leases_held")}
            group.register(
                GroupCollector(group.path, self._before_group_collect, hidden, per_upstream, lambda: self.upstreams)
            )

    def evicted(self, reason: str, count: int) -> None:
        """Count ``count`` evictions for ``reason``."""
        self.cache_evictions.labels(reason).inc(count)

    def track_inflight(self, upstream: str, read: Callable[[], float]) -> None:
        """``inflight_requests{upstream}`` is ``read()``: read at scrape time in one process
        (``set_function``); in a group, written to the files every :data:`GAUGE_SAMPLE_S`
        (:meth:`sampling`) and before each scrape of this worker."""
        self._track(self.inflight.labels(upstream), read)

    def untrack_inflight(self, upstream: str) -> None:
        """``inflight_requests{upstream}`` of a removed upstream leaves the metrics."""
        with contextlib.suppress(KeyError):
            self.inflight.remove(upstream)

    def serving(self, upstreams: Iterable[str]) -> None:
        """The upstreams the config served now names (at start and at each reload): in a group,
        the per-upstream gauges of no other upstream are exported."""
        self.upstreams = frozenset(upstreams)

    def serve_config(self, previous: str | None, sha256: str | None) -> None:
        """``config_info{sha256}`` is 1 for ``sha256`` only (``None``: not read from a file)."""
        if previous is not None and previous != sha256:
            with contextlib.suppress(KeyError):
                self.config_info.remove(previous)
        if sha256 is not None:
            self.config_info.labels(sha256).set(1)

    def track_store(self, store: SizedStore) -> None:
        """``cache_entries`` (entries) and ``cache_bytes`` (bytes of results) read from ``store``
        (``len(store)``, ``store.total_bytes``) as :meth:`track_inflight` reads its gauge: at
        scrape time in one process, every :data:`GAUGE_SAMPLE_S` and before this worker's own
        scrapes in a group. Reading the store counts the entries that expired since it was last
        looked at (``cache_evictions_total{reason="expired"}``)."""
        self._track(self.cache_entries, lambda: len(store))
        self._track(self.cache_bytes, lambda: store.total_bytes)

    def _track(self, gauge: Gauge, read: Callable[[], float]) -> None:
        if self._group is None:
            gauge.set_function(read)
        else:
            # set_function has no multiprocess form: sampled into the files instead.
            self._sampled.append((gauge, read))
            gauge.set(read())

    async def sampling(self, app: object) -> AsyncIterator[None]:
        """An aiohttp ``cleanup_ctx``: in a group, writes the gauges of :meth:`track_inflight`
        and :meth:`track_store` to the files every :data:`GAUGE_SAMPLE_S` seconds while the app runs; nothing in one
        process."""
        if self._group is None:
            yield
            return
        tasks = BackgroundTasks(logging.getLogger("mcp_gateway.metrics"))
        tasks.spawn(self._sample_every(GAUGE_SAMPLE_S), name="metrics-gauge-sampler")
        yield
        await tasks.close()

    async def _sample_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self._sample()

    def _sample(self) -> None:
        for gauge, read in self._sampled:
            gauge.set(read())

    def _before_group_collect(self) -> None:
        # This worker's requests not yet handed on (the journal's drain) and its gauges, to the
        # files, so that the scrape it answers is exact for itself.
        self.request_metrics._before_collect()
        self._sample()
