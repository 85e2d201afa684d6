"""``mcp-gateway serve --workers N``: one ``/metrics`` for the process group.

The gateway runs as operators run it, a real ``serve --workers 2`` process in front of a real SDK
upstream (``public_upstream``); every request and every scrape is on a new connection, which
either worker may accept (both accept on the one socket the parent bound). Before multiprocess mode, each
scrape reported the worker it reached (a hit counter read 8, 10, 8, 8, 8, 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry import MULTIPROC_DIR_ENV, GatewayMetrics, MultiProcessRegistry
from gateway.telemetry.metrics import _LATENCY_BUCKETS

from .support import mcp_headers, rpc
from .support.fleet import Upstream, fetch_counts, free_port, reset_counts
from .support.polling import wait_until
from .support.telemetry import record

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = 60  # tools/list requests sent, one connection each
SCRAPE_EVERY = 5  # a scrape after every this many requests: 12 while they are sent
START_TIMEOUT_S = 20.0
FLUSH_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 20.0
SHORT_TTL_MS = 6000  # cache.max_ttl_ms of the expiry test: public_upstream's 60 s lowered

pytestmark = pytest.mark.timeout(90)

#: (sample name, sorted labels) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@contextlib.asynccontextmanager
async def serve_workers(
    tmp_path: Path, upstream: Upstream, *, env: Mapping[str, str] | None = None
) -> AsyncIterator[str]:
    """``mcp-gateway serve --workers 2`` with ``upstream`` as ``up``, the registry off (no
    probes: only the test's requests reach the upstream); see :func:`serve_group`."""
    config = f'[registry]\nenabled = false\n[upstreams.up]\nurl = "{upstream.url}"\n'
    async with serve_group(tmp_path, config, env=env) as url:
        yield url


@contextlib.asynccontextmanager
async def serve_group(
    tmp_path: Path, config: str, *, env: Mapping[str, str] | None = None, log_level: str = "warning"
) -> AsyncIterator[str]:
    """``mcp-gateway serve --workers 2`` with ``config`` (TOML; ``[listener]`` is added) on a free
    port; yields the base URL. Both workers log (at ``log_level``) to ``tmp_path / "gateway.log"``.
    Stopped with SIGTERM (then SIGKILL) on exit, its log in the error if it does not start."""
    port = free_port()
    path = tmp_path / "gateway.toml"
    path.write_text(f"[listener]\nport = {port}\n{config}")
    log = tmp_path / "gateway.log"
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--workers", "2"]
    argv += ["--log-level", log_level]
    child_env = {k: v for k, v in os.environ.items() if k.upper() != MULTIPROC_DIR_ENV}
    child_env.update(env or {})
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out, cwd=ROOT, env=child_env)
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                assert proc.returncode is None, log.read_text(errors="replace")
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def tools_list(http: aiohttp.ClientSession, base_url: str, request_id: int) -> None:
    body = rpc("tools/list", request_id)
    async with http.post(f"{base_url}/servers/up/mcp", json=body, headers=mcp_headers("tools/list")) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["id"] == request_id


async def scrape(http: aiohttp.ClientSession, base_url: str) -> tuple[Samples, Samples]:
    """One ``/metrics``: (every counter and histogram sample, every gauge sample)."""
    async with http.get(f"{base_url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    cumulative: Samples = {}
    gauges: Samples = {}
    for family in text_string_to_metric_families(text):
        into = gauges if family.type == "gauge" else cumulative
        for s in family.samples:
            into[s.name, tuple(sorted(s.labels.items()))] = s.value
    return cumulative, gauges


def requests_total(samples: Samples) -> float:
    return sum(v for (name, _), v in samples.items() if name == "mcp_gateway_requests_total")


def lookups(samples: Samples, result: str) -> float:
    name = "mcp_gateway_cache_lookups_total"
    return sum(v for (n, labels), v in samples.items() if n == name and ("result", result) in labels)


def assert_never_decreases(scrapes: list[Samples]) -> None:
    """Every counter and histogram sample of a scrape is in every later one, never smaller."""
    for i, (before, after) in enumerate(itertools.pairwise(scrapes)):
        for key, value in before.items():
            assert key in after, f"scrape {i + 1}: {key} disappeared"
            assert after[key] >= value, f"scrape {i + 1}: {key} went from {value} to {after[key]}"


async def drive_and_scrape(base_url: str) -> tuple[list[Samples], Samples]:
    """Send REQUESTS tools/list requests, scraping after every SCRAPE_EVERY; then scrape until the
    requests counter reads REQUESTS (FLUSH_TIMEOUT_S at most) and ten times more. Returns the
    cumulative samples of every scrape and the gauges of the last one."""
    scrapes: list[Samples] = []
    # force_close: a new connection for every request and scrape, so each may reach either worker.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        for i in range(1, REQUESTS + 1):
            await tools_list(http, base_url, i)
            if i % SCRAPE_EVERY == 0:
                cumulative, _ = await scrape(http, base_url)
                assert requests_total(cumulative) <= i
                scrapes.append(cumulative)
        async with asyncio.timeout(FLUSH_TIMEOUT_S):
            while requests_total(scrapes[-1]) < REQUESTS:
                await asyncio.sleep(0.05)
                scrapes.append((await scrape(http, base_url))[0])
        for _ in range(10):
            cumulative, gauges = await scrape(http, base_url)
            assert requests_total(cumulative) == REQUESTS  # whichever worker answered
            scrapes.append(cumulative)
    return scrapes, gauges


async def test_with_two_workers_every_scrape_reports_the_sum_over_both_and_counters_never_go_back(
    tmp_path: Path, public_up: Upstream
) -> None:
    await reset_counts(public_up)
    async with serve_workers(tmp_path, public_up) as base_url:
        scrapes, gauges = await drive_and_scrape(base_url)
    assert len(scrapes) >= 10 + REQUESTS // SCRAPE_EVERY
    assert_never_decreases(scrapes)
    last = scrapes[-1]
    assert requests_total(last) == REQUESTS
    assert last["mcp_gateway_requests_total", (("method", "tools/list"), ("status", "200"), ("upstream", "up"))] == (
        REQUESTS
    )
    # Each worker has its own cache: one miss (and one upstream request) per worker, so both
    # answered, and both are in the sum.
    assert (await fetch_counts(public_up)).get("tools/list") == 2
    assert lookups(last, "miss") == 2 and lookups(last, "hit") == REQUESTS - 2
    hist = "mcp_gateway_request_duration_seconds"
    assert sum(v for (name, _), v in last.items() if name == f"{hist}_count") == REQUESTS
    assert gauges["mcp_gateway_cache_entries", ()] == 2  # livesum: one entry in each worker
    assert gauges["mcp_gateway_inflight_requests", (("upstream", "up"),)] == 0
    assert not any(name == "mcp_gateway_cluster_up" for name, _ in gauges)  # no [cluster]


async def test_with_two_workers_the_cache_size_gauges_sum_over_both_and_follow_expiry_with_no_request(
    tmp_path: Path, public_up: Upstream
) -> None:
    """Each worker's store is read for the gauges every GAUGE_SAMPLE_S: entries that expire leave
    the sum though no request comes to either worker."""
    await reset_counts(public_up)
    config = (
        f'[cache]\nmax_ttl_ms = {SHORT_TTL_MS}\n[registry]\nenabled = false\n[upstreams.up]\nurl = "{public_up.url}"\n'
    )
    async with (
        serve_group(tmp_path, config) as base_url,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
    ):
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(1, REQUESTS + 1):  # on new connections until each worker has stored the list once
            await tools_list(http, base_url, i)
            if (await fetch_counts(public_up)).get("tools/list") == 2:
                break
        assert (await fetch_counts(public_up)).get("tools/list") == 2, "one worker took every connection"
        sizes: list[tuple[float, float]] = []

        async def size_is(entries: float) -> bool:
            _, gauges = await scrape(http, base_url)
            sizes.append((gauges["mcp_gateway_cache_entries", ()], gauges["mcp_gateway_cache_bytes", ()]))
            return sizes[-1][0] == entries and (sizes[-1][1] > 0) == (entries > 0)

        # livesum: one entry in each worker, seen well before they expire
        await wait_until(lambda: size_is(2), limit_s=SHORT_TTL_MS / 1000 / 2, what="one entry in each worker")
        assert loop.time() - started < SHORT_TTL_MS / 1000, sizes  # seen before either entry expired
        await wait_until(lambda: size_is(0), limit_s=FLUSH_TIMEOUT_S + SHORT_TTL_MS / 1000, what="no entries left")
    assert (await fetch_counts(public_up)).get("tools/list") == 2, sizes  # no request refilled a cache


async def test_an_operators_multiproc_dir_is_emptied_of_an_earlier_runs_files_and_dead_workers_leave_it(
    tmp_path: Path, public_up: Upstream
) -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` set by the operator is used; a file of an earlier run there
    (a request counter of 1000) is removed at start, and the workers' live gauges at exit."""
    shared = tmp_path / "multiproc"
    shared.mkdir()
    stale = MmapedDict(str(shared / "counter_1.db"))
    labels = ["upstream", "method", "status"]
    key = mmap_key("mcp_gateway_requests", "mcp_gateway_requests_total", labels, ["up", "tools/list", "200"], "x")
    stale.write_value(key, 1000.0, 0.0)
    stale.close()
    async with serve_workers(tmp_path, public_up, env={MULTIPROC_DIR_ENV: str(shared)}) as base_url:
        scrapes, _ = await drive_and_scrape(base_url)
        assert not (shared / "counter_1.db").exists()
    assert requests_total(scrapes[-1]) == REQUESTS
    assert_never_decreases(scrapes)
    assert list(shared.glob("gauge_live*.db")) == []  # mark_process_dead for each worker
    assert len(list(shared.glob("counter_*.db"))) == 2  # counters stay: they are sums over the run


def test_batches_written_to_the_shared_files_read_back_as_counter_and_histogram_observe_would_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In multiprocess mode each batch goes to the files once per kind of request, bucket counts
    added per bucket: the same samples as prometheus_client's Counter and Histogram give."""
    observations = [("up", "tools/list", 200, "hit", "hit", s) for s in (0.0004, 0.0005, 0.002, 0.01, 5.0, 50.0)]
    observations += [("up", "tools/call", 502, "bypass", None, 0.3)] * 3
    observations += [("other", "tools/list", 200, "miss", "miss", 0.07)] * 2
    records = [
        record((u, m, "POST", status, None, cache, None, s), lookup, upstream_seconds=None if cache == "hit" else s / 2)
        for u, m, status, cache, lookup, s in observations
    ]
    reference = CollectorRegistry()  # before multiprocess mode: these values stay in the process
    requests = Counter("mcp_gateway_requests", "", ["upstream", "method", "status"], registry=reference)
    lookups_ = Counter("mcp_gateway_cache_lookups", "", ["upstream", "method", "result"], registry=reference)
    durations = Histogram(
        "mcp_gateway_request_duration_seconds",
        "",
        ["upstream", "method", "cache"],
        registry=reference,
        buckets=_LATENCY_BUCKETS,
    )
    upstream_durations = Histogram(
        "mcp_gateway_upstream_request_duration_seconds",
        "",
        ["upstream", "method"],
        registry=reference,
        buckets=_LATENCY_BUCKETS,
    )
    for r in records:
        requests.labels(r.upstream, r.method, str(r.status)).inc()
        if r.lookup is not None:
            lookups_.labels(r.upstream, r.method, r.lookup).inc()
        durations.labels(r.upstream, r.method, r.cache).observe(r.seconds)
        if r.upstream_seconds is not None:
            upstream_durations.labels(r.upstream, r.method).observe(r.upstream_seconds)

    # Multiprocess mode in this process, undone at the end of the test.
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    monkeypatch.setenv(MULTIPROC_DIR_ENV, str(tmp_path))
    group = MultiProcessRegistry(str(tmp_path))
    ours = GatewayMetrics(group)
    ours.request_metrics.add(records[:5])  # in two batches
    ours.request_metrics.add(records[5:])

    def samples(registry: CollectorRegistry) -> Samples:
        families = text_string_to_metric_families(generate_latest(registry).decode())
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in families
            if family.name.startswith(("mcp_gateway_request", "mcp_gateway_cache_lookups", "mcp_gateway_upstream_req"))
            for s in family.samples
            if not s.name.endswith("_created")
        }

    expected = samples(reference)
    assert expected and samples(group) == pytest.approx(expected)
