"""Metrics of a process group (``serve --workers N``): the workers share one port, so a scrape
reaches any one of them, and must report the sum over all of them. That is prometheus_client's
multiprocess mode, chosen by giving :class:`~.metrics.GatewayMetrics` a
:class:`MultiProcessRegistry`: every value lives in a per-process file under one directory
(``PROMETHEUS_MULTIPROC_DIR``), and
``/metrics`` reads and merges every file (``MultiProcessCollector``): counters and histograms
are summed over the workers, dead ones included (so they never go backwards), gauges by their
``multiprocess_mode``. Why this and not, say, pushing to one aggregator process: it is the
mechanism prometheus_client documents and maintains for exactly this, it needs no extra process
or socket, and a scrape costs the scraped worker a read of N small files.

* The per-request families (:class:`~.metrics.RequestMetrics`) are a custom collector, which multiprocess
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
  the shared tier, what an alert "shared tier down" wants). ``inflight_requests`` (from the
  upstreams) and ``cache_entries``/``cache_bytes`` (from the store) are read at scrape time in
  one process; ``set_function`` has no multiprocess form, so in a group each worker writes them
  every :data:`GAUGE_SAMPLE_S` and before its own scrapes (another worker's value is at most
  that old).
* The process that forks the workers calls ``mark_process_dead`` for each that exits (``live*``
  gauges drop it) and owns the directory (``gateway.cli``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import values as client_values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = [
    "GAUGE_SAMPLE_S",
    "MULTIPROC_DIR_ENV",
    "Family",
    "GroupCollector",
    "MultiProcessRegistry",
    "SharedRequestSeries",
    "ZeroOnRemoveGauge",
    "metrics_dir",
]

#: The environment variable naming prometheus_client's multiprocess directory.
MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
#: In a process group, how often (seconds) each worker writes the gauges it reads from its own
#: state (``inflight_requests``, ``cache_entries``, ``cache_bytes``) to the shared files.
GAUGE_SAMPLE_S: Final = 1.0

#: A metric family: name after the namespace, help, label names.
Family = tuple[str, str, tuple[str, ...]]


class SharedRequestSeries:
    """The per-request families as prometheus_client ``Counter``/``Histogram`` values in this
    process's multiprocess files (registered nowhere: ``MultiProcessCollector`` reads the files)."""

    def __init__(
        self,
        namespace: str,
        bounds: Sequence[float],
        requests: Family,
        lookups: Family,
        durations: Family,
        upstream_durations: Family,
    ) -> None:
        def counter(name: str, documentation: str, labels: Sequence[str]) -> Counter:
            return Counter(f"{namespace}_{name}", documentation, labels, registry=None)

        def histogram(name: str, documentation: str, labels: Sequence[str]) -> Histogram:
            return Histogram(f"{namespace}_{name}", documentation, labels, registry=None, buckets=bounds)

        self.requests = counter(*requests)
        self.lookups = counter(*lookups)
        self.durations = histogram(*durations)
        self.upstream_durations = histogram(*upstream_durations)
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


class MultiProcessRegistry(CollectorRegistry):
    """The registry of one worker of a process group (``serve --workers N``). Given to
    :class:`~.metrics.GatewayMetrics`, it puts the metrics in multiprocess mode (see the module): values
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


class GroupCollector:
    """Every metric of a process group, read from the multiprocess files under ``path`` after
    ``before()`` has written this process's pending values; families named in ``hidden`` left out,
    and of the families in ``per_upstream`` the series of upstreams not in ``served()`` (the names
    the config serves now; ``None``: every one)."""

    def __init__(
        self,
        path: str,
        before: Callable[[], None],
        hidden: Iterable[str],
        per_upstream: Iterable[str] = (),
        served: Callable[[], Collection[str] | None] = lambda: None,
    ) -> None:
        self._files = MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]
        self._before = before
        self._hidden = frozenset(hidden)
        self._per_upstream = frozenset(per_upstream)
        self._served = served

    def collect(self) -> Iterator[Metric]:
        self._before()
        served = self._served()
        for metric in self._files.collect():  # type: ignore[no-untyped-call]
            if metric.name in self._hidden:
                continue
            if served is not None and metric.name in self._per_upstream:
                metric.samples = [s for s in metric.samples if s.labels.get("upstream") in served]
            yield metric


class ZeroOnRemoveGauge(Gauge):
    """A gauge in multiprocess mode whose removed series read 0: the files cannot drop a
    series (prometheus_client warns and keeps its last value)."""

    def remove(self, *labelvalues: Any) -> None:
        self.labels(*labelvalues).set(0)


@contextlib.contextmanager
def metrics_dir() -> Iterator[str]:
    """The directory of a process group's metric files (prometheus_client multiprocess mode):
    ``$PROMETHEUS_MULTIPROC_DIR`` when the operator set it (created if missing; the ``*.db``
    files of an earlier run removed first, as prometheus_client advises, and left at exit), else
    a new temporary directory, removed at exit."""
    given = os.environ.get(MULTIPROC_DIR_ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        for stale in glob.glob(os.path.join(glob.escape(given), "*.db")):
            os.remove(stale)
        yield given
        return
    path = tempfile.mkdtemp(prefix="mcp-gateway-metrics-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
