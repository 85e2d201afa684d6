"""Prometheus metrics of the gateway, created against an injected ``CollectorRegistry``.

Label values come only from configured upstream names, known MCP method names (else
``other``) and fixed outcome sets; never ids, tool names, URIs or tokens.

One process (``serve``, every ``create_app`` by default): each metric lives in the process and
is rendered from the registry; nothing here costs a request more than it did.

A process group (``serve --workers N``): the workers share one port, so a scrape reaches any
one of them, and must report the sum over all of them. That is prometheus_client's
multiprocess mode, chosen by giving :class:`GatewayMetrics` a :class:`MultiProcessRegistry`:
every value lives in a per-process file under one directory (``PROMETHEUS_MULTIPROC_DIR``), and
``/metrics`` reads and merges every file (``MultiProcessCollector``): counters and histograms
are summed over the workers, dead ones included (so they never go backwards), gauges by their
``multiprocess_mode``. Why this and not, say, pushing to one aggregator process: it is the
mechanism prometheus_client documents and maintains for exactly this, it needs no extra process
or socket, and a scrape costs the scraped worker a read of N small files.

* The per-request families (:class:`RequestMetrics`) are a custom collector, which multiprocess
  mode cannot see in other processes. In that mode each batch is also added, once per kind of
  request in it, to real ``Counter``/``Histogram`` objects whose values live in the files (a
  histogram per bucket: prometheus_client has no public call adding n observations to one
  bucket, so the bucket values ``Histogram.observe`` increments are incremented by n; a test
  pins the result against ``observe``). The journal hands a batch on at most ``BATCH_DELAY_S``
  after a request ends, and the scraped worker drains its own first, so a scrape sees every
  request the group answered more than that long before it.
* Gauges: ``cache_entries``/``cache_bytes``, ``inflight_requests`` and ``cluster_leases_held``
  are per worker, summed over live ones (``livesum``); ``upstream_up`` and
  ``upstream_supported_version`` are each worker's own probe results, the most recent one wins
  (``mostrecent``; a removed version label reads 0, the files cannot drop a series);
  ``cluster_up`` is the minimum over live workers (``livemin``: 0 when any worker serves without
  the shared tier, what an alert "shared tier down" wants). ``inflight_requests`` is read from
  the upstreams at scrape time in one process; ``set_function`` has no multiprocess form, so in
  a group each worker writes it every :data:`GAUGE_SAMPLE_S` and before its own scrapes.
* The process that forks the workers calls ``mark_process_dead`` for each that exits (``live*``
  gauges drop it) and owns the directory (``gateway.cli``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import values as client_values
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.utils import floatToGoString

from ..tasks import BackgroundTasks
from .record import RequestRecord

__all__ = ["GAUGE_SAMPLE_S", "MULTIPROC_DIR_ENV", "GatewayMetrics", "MultiProcessRegistry", "RequestMetrics"]

#: The environment variable naming prometheus_client's multiprocess directory.
MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
#: In a process group, how often (seconds) each worker writes the gauges it reads from its own
#: state (``inflight_requests``) to the shared files.
GAUGE_SAMPLE_S: Final = 1.0

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
        self._shared = _SharedRequestSeries(namespace, self._bounds) if shared else None
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
        sums = _sums(list(zip(upstream, method, cache, strict=True)), seconds)
        for key, total in sums.items():
            durations[key][-1] += total
        forwarded = [(r.upstream, r.method, r.upstream_seconds) for r in records if r.upstream_seconds is not None]
        upstream_counts, upstream_sums = (
            self._observe(self._upstream_durations, [(u, m) for u, m, _ in forwarded], [s for _, _, s in forwarded])
            if forwarded
            else ({}, {})
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


class _SharedRequestSeries:
    """The per-request families as prometheus_client ``Counter``/``Histogram`` values in this
    process's multiprocess files (registered nowhere: ``MultiProcessCollector`` reads the files)."""

    def __init__(self, namespace: str, bounds: Sequence[float]) -> None:
        def counter(name: str, documentation: str, labels: Sequence[str]) -> Counter:
            return Counter(f"{namespace}_{name}", documentation, labels, registry=None)

        def histogram(name: str, documentation: str, labels: Sequence[str]) -> Histogram:
            return Histogram(f"{namespace}_{name}", documentation, labels, registry=None, buckets=bounds)

        self.requests = counter(*_REQUESTS)
        self.lookups = counter(*_LOOKUPS)
        self.durations = histogram(*_DURATIONS)
        self.upstream_durations = histogram(*_UPSTREAM_DURATIONS)
        # The children by label values: labels() validates and locks on every call.
        self._children: dict[tuple[Counter | Histogram, tuple[str, ...]], Any] = {}

    def _child(self, parent: Counter | Histogram, *labelvalues: str) -> Any:
        key = (parent, labelvalues)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = parent.labels(*labelvalues)
        return child

    def add(
        self,
        kinds: Mapping[tuple[str, str, int, str, str | None, int], int],
        sums: Mapping[tuple[str, str, str], float],
        upstream_counts: Mapping[tuple[Any, int], int],
        upstream_sums: Mapping[Any, float],
    ) -> None:
        """Add one batch: ``kinds`` counts requests by (upstream, method, status, cache, lookup
        result, duration bucket index), ``sums`` their seconds by (upstream, method, cache); the
        ``upstream_*`` pair the same for the time upstreams took, by ((upstream, method), bucket)."""
        child, requests, lookups, durations = self._child, self.requests, self.lookups, self.durations
        for (u, m, code, c, result, bucket), count in kinds.items():
            child(requests, u, m, str(code)).inc(count)
            if result is not None:
                child(lookups, u, m, result).inc(count)
            _add_observations(child(durations, u, m, c), bucket, count)
        for key, total in sums.items():
            _add_sum(child(durations, *key), total)
        for (key, bucket), count in upstream_counts.items():
            _add_observations(child(self.upstream_durations, *key), bucket, count)
        for key, total in upstream_sums.items():
            _add_sum(child(self.upstream_durations, *key), total)


# prometheus_client has no public call that adds n observations at once; Histogram.observe once
# per request would cost the batch what batching saves. These increment the values observe()
# increments (one per bound, +Inf last, and the sum); test_workers pins the result against observe().


def _add_observations(child: Histogram, bucket: int, count: int) -> None:
    """``count`` observations in bucket ``bucket`` (an index into the bounds, +Inf last)."""
    child._buckets[bucket].inc(count)


def _add_sum(child: Histogram, total: float) -> None:
    """``total`` seconds added to the histogram's sum."""
    child._sum.inc(total)


def _sums(keys: list[Any], values: Sequence[float]) -> dict[Any, float]:
    """The sum of ``values`` by key."""
    sums: dict[Any, float] = {}
    for key, value in zip(keys, values, strict=True):
        sums[key] = sums.get(key, 0.0) + value
    return sums


class MultiProcessRegistry(CollectorRegistry):
    """The registry of one worker of a process group (``serve --workers N``). Given to
    :class:`GatewayMetrics`, it puts the metrics in multiprocess mode (see the module): values
    in this process's files under ``path``, and a collect reports the sum over every process
    that wrote files there.

    Creating one puts prometheus_client in multiprocess mode in this process (``path`` becomes
    ``PROMETHEUS_MULTIPROC_DIR``): create it before any metric, at most one set of gateway
    metrics per process (two would write the same file entries).

    Raises:
        ValueError: this process is in multiprocess mode with another directory already.
    """

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        if getattr(client_values.ValueClass, "_multiprocess", False):
            if os.environ.get(MULTIPROC_DIR_ENV) != path:
                raise ValueError(f"prometheus_client already keeps its values in {os.environ.get(MULTIPROC_DIR_ENV)}")
            return
        # prometheus_client chooses file-backed values when it is imported, from this variable;
        # the gateway imported it before the directory existed, so choose again the way it does
        # (its own tests swap values.ValueClass the same way). No metric exists yet (above).
        os.environ[MULTIPROC_DIR_ENV] = path
        client_values.ValueClass = client_values.get_value_class()  # type: ignore[no-untyped-call]


class _GroupCollector:
    """Every metric of a process group, read from the multiprocess files under ``path`` after
    ``before()`` has written this process's pending values; families named in ``hidden`` left out."""

    def __init__(self, path: str, before: Callable[[], None], hidden: Iterable[str]) -> None:
        self._files = MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]
        self._before = before
        self._hidden = frozenset(hidden)

    def collect(self) -> Iterator[Metric]:
        self._before()
        for metric in self._files.collect():  # type: ignore[no-untyped-call]
            if metric.name not in self._hidden:
                yield metric


class _ZeroOnRemoveGauge(Gauge):
    """A gauge in multiprocess mode whose removed series read 0: the files cannot drop a
    series (prometheus_client warns and keeps its last value)."""

    def remove(self, *labelvalues: Any) -> None:
        self.labels(*labelvalues).set(0)


class GatewayMetrics:
    """Every metric the gateway exports (README, "Metrics").

    With a :class:`MultiProcessRegistry` the metrics are in multiprocess mode (see the module);
    with any other registry they live in this process, registered there.
    """

    def __init__(self, registry: CollectorRegistry, *, cluster: bool = False) -> None:
        self.registry = registry
        ns = "mcp_gateway"
        group = registry if isinstance(registry, MultiProcessRegistry) else None
        self._group = group
        # In a group the metrics register nowhere: every worker's values are read from the files.
        own = registry if group is None else None
        #: (gauge, read) of the gauges read from this process's state (see track_inflight).
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
        self.cache_evictions = Counter(
            "cache_evictions",
            "Cache entries removed, by reason.",
            ["reason"],
            namespace=ns,
            registry=own,
        )
        # multiprocess_mode only matters in a group (module docstring); one process ignores it.
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
        self.upstream_supported_version = (Gauge if group is None else _ZeroOnRemoveGauge)(
            "upstream_supported_version",
            "1 for each protocol version the upstream advertises.",
            ["upstream", "version"],
            namespace=ns,
            registry=own,
            multiprocess_mode="mostrecent",
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

        # The shared tier ([cluster]). cluster_up exists only with it: an alert on it being 0
        # must not fire for a gateway that has no shared tier.
        self.cluster_up = Gauge(
            "cluster_up",
            "1 while the shared tier (Redis) answers, 0 while the gateway serves without it.",
            namespace=ns,
            registry=own if cluster else None,
            multiprocess_mode="livemin",
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
            "Shared-tier lookups after a local miss, by result (hit, miss, corrupt, error).",
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
            hidden = () if cluster else (f"{ns}_cluster_up",)
            group.register(_GroupCollector(group.path, self._before_group_collect, hidden))

    def evicted(self, reason: str, count: int) -> None:
        """Count ``count`` evictions for ``reason``."""
        self.cache_evictions.labels(reason).inc(count)

    def track_inflight(self, upstream: str, read: Callable[[], float]) -> None:
        """``inflight_requests{upstream}`` is ``read()``: read at scrape time in one process
        (``set_function``); in a group, written to the files every :data:`GAUGE_SAMPLE_S`
        (:meth:`sampling`) and before each scrape of this worker."""
        child = self.inflight.labels(upstream)
        if self._group is None:
            child.set_function(read)
        else:
            self._sampled.append((child, read))
            child.set(read())

    async def sampling(self, app: object) -> AsyncIterator[None]:
        """An aiohttp ``cleanup_ctx``: in a group, writes the gauges of :meth:`track_inflight`
        to the files every :data:`GAUGE_SAMPLE_S` seconds while the app runs; nothing in one
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
