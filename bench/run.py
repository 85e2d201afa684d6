"""``make bench``: the gateway's performance yardstick, measured as ratios in one run.

Usage: python bench/run.py [--quick] [--workers 1,2] [--duration S] [--connections 32] [--out PATH]

Starts on 127.0.0.1 only: a real ``mcp`` SDK upstream with 25 tools (bench/upstream_25_tools.py,
~19 KB ``tools/list``, public cache hints), the bare aiohttp floor (bench/floor.py: same
bytes, same event loop, same process count as the gateway), the gateway (``mcp-gateway serve``,
default logging, i.e. the JSON access log at INFO, ``--workers N``), a second gateway with
``max_entries = 0`` (caching off), and for the memory figure a scripted upstream with ~4 KB
pages (bench/paged_upstream.py). Load comes from ``wrk`` (bench/mcp.lua) and, for the cold
burst, the memory fill and the cluster part, from this script (its plumbing: bench/harness.py).
Every load is bounded in time and requests.

For each worker count N it measures, side by side:
  cached      ``tools/list`` and ``server/discover`` hits: requests/s, p50, p99, ratio to the floor
              (the floor answers the same bytes as the upstream does for that method);
  forwarding  ``tools/call`` (never cacheable) through the gateway and ``tools/list`` through
              the caching-off gateway, against the upstream directly: added p50/p99 latency at
              1 connection, throughput ratio at 8 connections;
  cold burst  200 concurrent identical ``tools/list`` on an empty cache: upstream requests made
              (counted by the upstream itself);
  cluster     with one worker, a gateway with ``[cluster]`` (on a ``redis-server`` this script
              starts) is one more target of the cached rotation: hits from its local tier;
and once: with replicas on that Redis (bench/cluster.py), a hit from Redis against a local hit,
a cold burst over 2 replicas, purge to consistency over 3; a hot key across many expiries with
and without refresh-ahead (bench/stale.py: p99/max latency, upstream requests per lifetime);
``POST /mcp`` of two members on the SDK upstream against the per-upstream route on one 1-worker
gateway (bench/aggregate.py: warm ``tools/list`` throughput ratio, ``tools/call`` added latency);
20 config reloads (``POST /admin/reload``) of a 1-worker gateway with 100 upstreams under a steady
load of hits (bench/reload.py: reload time, hit p99 during reloads against without);
a warm ``tools/list`` for a JWT caller and filtered by ``[[policy.rules]]`` against a static token's,
and the added cost of a JWT and of an introspected token, seen before and never seen, on one
1-worker gateway with ``[auth.jwt]`` and ``[auth.introspection]`` (bench/auth.py);
with one worker, resident memory per stored ~4 KB entry over 10,000 entries.

Prints markdown tables and writes JSON to bench-results/latest.json. Child processes are
stopped on exit, error and Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ (also when imported from elsewhere)

import aggregate
import auth
import cluster
import reload
import stale
from harness import (
    BENCH,
    HOST,
    PY,
    ROOT,
    Fleet,
    fetch,
    finish_wrk,
    fleet_context,
    free_port,
    gateway_argv,
    log,
    mcp_body,
    mcp_call,
    mcp_headers,
    median_run,
    metric,
    read_response,
    rss_kib,
    set_group_affinity,
    start_wrk,
    upstream_counts,
    wait_ready,
    wrk,
)

CALL_NAME = "get_issue"
CALL_ARGS = {"repo": "acme/payments-api", "number": 42}

TARGETS = {
    # A hit against the floor with 1 worker (the contended ratio, see contended_runs) and with
    # more (the sequential one), and the same on the plain path (--plain-path: the hit path
    # without gateway/proxy/hot.py's speed-ups), any worker count.
    "cached_ratio_min": 0.85,
    "cached_ratio_min_workers": 0.8,
    "plain_ratio_min": 0.8,
    "forward_added_p50_ms_max": 1.0,
    "cold_burst_upstream_requests": 1,
    "memory_ratio_max": 2.5,
    # The cluster part (bench/cluster.py): a replica's local tier as near the floor as a plain
    # gateway, a shared hit adding at most 0.5 ms at p50, one upstream request per cold burst
    # across replicas, a purge seen by the other replicas within 100 ms (p99).
    "cluster_cached_ratio_min": 0.8,
    "cluster_shared_added_p50_ms_max": 0.5,
    "cluster_burst_upstream_requests": 1,
    "cluster_purge_p99_ms_max": 100,
    # The refresh part (bench/stale.py): with refresh-ahead, a hot key never misses,
    # its p99 stays under one upstream round trip, and a 1 s lifetime is refreshed at half-life.
    "refresh_misses": 0,
    "refresh_upstream_per_ttl_max": 2.2,
    # The aggregate part (bench/aggregate.py): a warm `tools/list` of two members on /mcp at least
    # 0.8 of a warm per-upstream one, same process; a `tools/call` through /mcp adds at most 1 ms
    # at p50.
    "aggregate_list_ratio_min": 0.8,
    "aggregate_call_added_p50_ms_max": 1.0,
    # The reload part (bench/reload.py): 20 reloads of a 100-upstream config under a steady load of
    # hits add at most 2 ms to the hits' p99.
    "reload_added_p99_ms_max": 2.0,
    # The auth part (bench/auth.py): a warm tools/list for a JWT caller against the same for a static
    # token, and filtered by a rule keeping half the tools against the whole list, same process.
    "auth_jwt_ratio_min": 0.9,
    "auth_filtered_ratio_min": 0.85,
}


def cpu_plan(workers: int, pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(CPUs for the servers under test, CPUs for wrk) during the cached runs. With one worker
    and at least two CPUs, the floor and the gateway get CPU 0 and wrk the others, so the
    load generator never competes with the server it measures (both servers alike). The
    forwarding runs are not pinned: there the upstream needs a CPU too."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or workers != 1 or len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


# -- the cold burst ---------------------------------------------------------------------------


async def _burst(port: int, path: str, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for start in range(0, count, 50):  # connect first (in batches: accept backlog), send later
            conns += await asyncio.gather(*(asyncio.open_connection(HOST, port) for _ in range(start, start + 50)))
        conns = conns[:count]
        await asyncio.sleep(0.5)  # let the server accept every connection: only the requests race
        head = f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in mcp_headers("tools/list").items()
        )
        requests = []
        for i in range(count):
            body = mcp_body("tools/list", f"burst-{i}")
            requests.append(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        for (_, writer), request in zip(conns, requests, strict=True):  # all sent in one loop pass
            writer.write(request)
        return await asyncio.wait_for(asyncio.gather(*(read_response(r) for r, _ in conns)), 60)
    finally:
        for _, writer in conns:
            writer.close()


def cold_burst(gw_port: int, upstream_port: int, count: int = 200) -> dict[str, Any]:
    before = upstream_counts(upstream_port)["tools/list"]
    started = time.perf_counter()
    responses = asyncio.run(_burst(gw_port, "/servers/workspace/mcp", count))
    elapsed = time.perf_counter() - started
    made = upstream_counts(upstream_port)["tools/list"] - before
    statuses = Counter(str(s) for s, _, _ in responses)
    kinds: Counter[str] = Counter()
    wrong_ids = 0
    for i, (_, headers, body) in enumerate(responses):
        cs = headers.get("cache-status", "")
        kinds["collapsed" if "collapsed" in cs else "hit" if "; hit" in cs else "miss" if "fwd=miss" in cs else cs] += 1
        if json.loads(body).get("id") != f"burst-{i}":
            wrong_ids += 1
    return {
        "requests": count,
        "upstream_requests": made,
        "statuses": dict(statuses),
        "cache_status": dict(kinds),
        "wrong_ids": wrong_ids,
        "seconds": round(elapsed, 3),
    }


# -- memory -----------------------------------------------------------------------------------


async def _fill(port: int, cursors: list[str], concurrency: int = 16) -> Counter[str]:
    import aiohttp

    outcomes: Counter[str] = Counter()
    queue = iter(cursors)
    url = f"http://{HOST}:{port}/servers/paged/mcp"

    async def worker(session: aiohttp.ClientSession) -> None:
        for cursor in queue:
            async with session.post(
                url, data=mcp_body("tools/list", 1, cursor=cursor), headers=mcp_headers("tools/list")
            ) as resp:
                await resp.read()
                cs = resp.headers.get("Cache-Status", "")
                outcomes["stored" if resp.status == 200 and "stored" in cs else f"{resp.status} {cs}"] += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return outcomes


def memory(fleet: Fleet, workdir: Path, entries: int, opts: argparse.Namespace) -> dict[str, Any]:
    paged_port, gw_port = free_port(), free_port()
    paged = fleet.start("paged-upstream", [PY, str(BENCH / "paged_upstream.py"), str(paged_port)])
    wait_ready(fleet, "paged-upstream", paged, lambda: fetch(paged_port, "GET", "/_counts")[0] == 200)
    config = workdir / "gateway-memory.toml"
    config.write_text(
        f'[listener]\nhost = "{HOST}"\nport = {gw_port}\n\n[cache]\nmax_entries = {entries * 2}\n\n'
        f'[upstreams.paged]\nurl = "http://{HOST}:{paged_port}/mcp"\n'
    )
    gw = fleet.start("gateway-memory", gateway_argv(config, 1, "info", opts.loop))
    wait_ready(fleet, "gateway-memory", gw, lambda: fetch(gw_port, "GET", "/readyz")[0] == 200)
    warm = asyncio.run(_fill(gw_port, [f"warm-{i}" for i in range(200)]))
    time.sleep(0.5)
    rss_before = rss_kib(gw.pid)
    bytes_before = metric(gw_port, "mcp_gateway_cache_bytes")
    started = time.perf_counter()
    outcomes = asyncio.run(_fill(gw_port, [f"c{i:06d}" for i in range(entries)]))
    fill_s = time.perf_counter() - started
    time.sleep(0.5)
    rss_after = rss_kib(gw.pid)
    bytes_after = metric(gw_port, "mcp_gateway_cache_bytes")
    stored_entries = metric(gw_port, "mcp_gateway_cache_entries")
    fleet.stop(gw)
    fleet.stop(paged)
    payload = (bytes_after - bytes_before) / entries
    per_entry = (rss_after - rss_before) * 1024 / entries
    return {
        "entries": entries,
        "stored": outcomes.get("stored", 0),
        "not_stored": {k: v for k, v in outcomes.items() if k != "stored"}
        | {f"warm {k}": v for k, v in warm.items() if k != "stored"},
        "entries_in_cache": stored_entries,
        "payload_bytes_per_entry": round(payload, 1),
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "rss_bytes_per_entry": round(per_entry, 1),
        "ratio": round(per_entry / payload, 3) if payload else None,
        "fill_seconds": round(fill_s, 2),
    }


# -- one worker count ----------------------------------------------------------------------------


def write_gateway_config(path: Path, port: int, upstream_port: int, *, caching: bool) -> None:
    cache = "" if caching else "[cache]\nmax_entries = 0   # caching off: every request is forwarded\n\n"
    path.write_text(
        f'[listener]\nhost = "{HOST}"\nport = {port}\n\n{cache}'
        f'[upstreams.workspace]\nurl = "http://{HOST}:{upstream_port}/mcp"\n'
    )


def check_hit(port: int, method: str) -> None:
    """A cached answer through the gateway: 200, a hit, the caller's id, a ttlMs."""
    status, headers, body = mcp_call(port, "/servers/workspace/mcp", method, "check-hit")
    msg = json.loads(body)
    ok = (
        status == 200
        and headers.get("cache-status", "").startswith("mcp-gateway; hit")
        and msg.get("id") == "check-hit"
        and isinstance(msg.get("result", {}).get("ttlMs"), int)
    )
    if not ok:
        raise RuntimeError(f"{method} through the gateway is not a correct hit: {status} {headers} {body[:200]!r}")


def bench_workers(
    fleet: Fleet,
    workdir: Path,
    n: int,
    up_port: int,
    bodies: dict[str, Path],
    opts: argparse.Namespace,
    redis_port: int | None = None,
) -> dict[str, Any]:
    """Every part for ``n`` workers; with ``redis_port`` (the cluster part) and one worker, the
    cached rotation also has a gateway with ``[cluster]`` (bench/cluster.py)."""
    parts = opts.parts
    with_cluster = redis_port is not None and n == 1
    cached = "cached" in parts or with_cluster
    floor_port, gw_port, off_port, plain_port = free_port(), free_port(), free_port(), free_port()
    floor_argv = [PY, str(BENCH / "floor.py"), "--port", str(floor_port), "--workers", str(n), "--loop", opts.loop]
    floor_argv += ["--body", str(bodies["tools/list"])] + [f"--body={m}={p}" for m, p in bodies.items()]
    server_cpus, wrk_cpus = cpu_plan(n, opts.pin)
    on_cfg, off_cfg = workdir / f"gateway-{n}.toml", workdir / f"gateway-{n}-off.toml"
    plain_cfg = workdir / f"gateway-{n}-plain.toml"
    write_gateway_config(on_cfg, gw_port, up_port, caching=True)
    write_gateway_config(off_cfg, off_port, up_port, caching=False)
    write_gateway_config(plain_cfg, plain_port, up_port, caching=True)
    # (name, process, port) of each server this worker count needs, by role.
    servers: dict[str, tuple[str, subprocess.Popen[bytes], int]] = {}
    if cached:
        servers["floor"] = (f"floor-{n}", fleet.start(f"floor-{n}", floor_argv), floor_port)
    if parts & {"burst", "cached", "forwarding"}:
        servers["gateway"] = (
            f"gateway-{n}",
            fleet.start(f"gateway-{n}", gateway_argv(on_cfg, n, opts.log_level, opts.loop)),
            gw_port,
        )
    if "forwarding" in parts:
        off = fleet.start(f"gateway-{n}-off", gateway_argv(off_cfg, n, opts.log_level, opts.loop))
        servers["off"] = (f"gateway-{n}-off", off, off_port)
    if "cached" in parts:
        plain = fleet.start(f"gateway-{n}-plain", gateway_argv(plain_cfg, n, opts.log_level, opts.loop, plain=True))
        servers["plain"] = (f"gateway-{n}-plain", plain, plain_port)
    if with_cluster:
        assert redis_port is not None
        replica = cluster.start_cached_replica(fleet, workdir, up_port, redis_port, opts)
        servers["cluster"] = (replica.name, replica.proc, replica.port)
    for role, (name, proc, port) in servers.items():
        if role == "floor":
            wait_ready(fleet, name, proc, lambda port=port: fetch(port, "POST", "/", b"{}")[0] == 200)
        else:
            wait_ready(fleet, name, proc, lambda port=port: fetch(port, "GET", "/readyz")[0] == 200)
    time.sleep(0.5 * n)  # every worker up, not only the first to answer
    path = "/servers/workspace/mcp"
    urls = {role: f"http://{HOST}:{port}{path}" for role, (_, _, port) in servers.items()}
    urls["floor"] = f"http://{HOST}:{floor_port}{path}"
    direct_url = f"http://{HOST}:{up_port}/mcp"
    out: dict[str, Any] = {
        "workers": n,
        # Only for the cached runs: when forwarding, the upstream needs a CPU as well.
        "cpus": {"servers": sorted(server_cpus), "wrk": sorted(wrk_cpus or ())} if server_cpus and cached else None,
    }

    if "burst" in parts:
        log(f"[workers={n}] cold burst: 200 concurrent tools/list on an empty cache")
        out["cold_burst"] = cold_burst(gw_port, up_port)
    if cached:
        # The floor first; then the gateway, its plain path and the [cluster] replica, those present.
        targets = {role: (urls[role], servers[role][1], servers[role][2]) for role in CACHED_ROLES if role in servers}
        every_cpu = os.sched_getaffinity(0)
        for _, proc, _ in targets.values():
            set_group_affinity(proc.pid, server_cpus or every_cpu)
        opts.wrk_cpus = wrk_cpus
        try:
            out["cached"] = cached_runs(fleet, n, targets, up_port, bodies, opts)
        finally:
            for _, proc, _ in targets.values():
                set_group_affinity(proc.pid, every_cpu)
            opts.wrk_cpus = None
    if "forwarding" in parts:
        out["forwarding"] = forwarding_runs(fleet, n, direct_url, urls["gateway"], urls["off"], opts)
    for _, proc, _ in servers.values():
        fleet.stop(proc)
    return out


#: The cached rotation's targets, in their first round's order ("floor" first, the reference).
CACHED_ROLES = ("floor", "gateway", "plain", "cluster")


def cached_runs(
    fleet: Fleet,
    n: int,
    targets: dict[str, tuple[str, subprocess.Popen[bytes], int]],
    up_port: int,
    bodies: dict[str, Path],
    opts: argparse.Namespace,
) -> dict[str, Any]:
    """Cached hits on the floor and on each gateway in ``targets`` (role -> url, process, port):
    the gateway, the gateway on its plain path (no hit-path speed-ups, ``--plain-path``), the
    gateway with ``[cluster]`` (hits from its local tier); the order rotated every round."""
    path = "/servers/workspace/mcp"

    # Warm every worker's cache (new connections spread over the workers), then check.
    for role, (_, _, gw_port) in targets.items():
        if role == "floor":
            continue
        for method in ("tools/list", "server/discover"):
            for i in range(20 * n):
                mcp_call(gw_port, path, method, i)
            check_hit(gw_port, method)
    before = upstream_counts(up_port)
    cached: dict[str, Any] = {}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    order = list(targets)
    for r in range(opts.rounds):
        for method in ("tools/list", "server/discover"):
            # The order rotates every round (each target first in turn): a machine that speeds
            # up or slows down during a round favours no side over the rounds.
            k = r % len(order)
            for target in order[k:] + order[:k]:
                url, server, _ = targets[target]
                log(f"[workers={n}] cached {method}: {target} (round {r + 1}/{opts.rounds})")
                runs.setdefault((method, target), []).append(
                    wrk(
                        fleet,
                        url,
                        method,
                        connections=opts.connections,
                        duration=opts.duration,
                        server=server,
                        cpus=opts.wrk_cpus,
                    )
                )
    contended = contended_runs(fleet, n, targets, opts)
    upstream_during = upstream_counts(up_port) - before
    for method in ("tools/list", "server/discover"):
        floor_runs = runs[(method, "floor")]
        row: dict[str, Any] = {"floor": median_run(floor_runs), "response_bytes": bodies[method].stat().st_size}
        for target in order:
            if target == "floor":
                continue
            target_runs = runs[(method, target)]
            ratios = [g["rps"] / f["rps"] for g, f in zip(target_runs, floor_runs, strict=True)]
            # "ratio" for the gateway; "plain_ratio" for the same gateway without the hit path's
            # speed-ups (gateway/proxy/hot.py); "cluster_ratio" for the gateway with [cluster].
            name = "ratio" if target == "gateway" else f"{target}_ratio"
            row[target] = median_run(target_runs)
            row[name] = round(statistics.median(ratios), 3)
            row[f"{name}_all"] = [round(x, 3) for x in ratios]
            if target == "gateway":
                cpu_ratios = [
                    f["cpu_us_per_request"] / g["cpu_us_per_request"]
                    for g, f in zip(target_runs, floor_runs, strict=True)
                    if g["cpu_us_per_request"] and f["cpu_us_per_request"]
                ]
                # floor CPU per request / gateway CPU per request: the same ratio, less sensitive
                # to other load on the machine (it is what the throughput ratio would be if both
                # had the CPU to themselves).
                row["cpu_ratio"] = round(statistics.median(cpu_ratios), 3) if cpu_ratios else None
            pairs = contended.get((method, target), [])
            if pairs:
                # The same ratio with both on the CPUs at once (see contended_runs).
                shared = [g["rps"] / f["rps"] for f, g in pairs]
                row[f"{name}_contended"] = round(statistics.median(shared), 3)
                row[f"{name}_contended_all"] = [round(x, 3) for x in shared]
                cpu = [(f["cpu_us_per_request"], g["cpu_us_per_request"]) for f, g in pairs]
                row[f"{target}_contended_cpu_us"] = round(statistics.median(g for _, g in cpu), 1)
                row[f"floor_contended_cpu_us_{target}"] = round(statistics.median(f for f, _ in cpu), 1)
        cached[method] = row
    cached["upstream_requests_during_cached_runs"] = dict(upstream_during)
    return cached


def contended_runs(
    fleet: Fleet, n: int, targets: dict[str, tuple[str, subprocess.Popen[bytes], int]], opts: argparse.Namespace
) -> dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """Contended rounds: the floor and one other target loaded at the same time, each by its
    own wrk (both on the wrk CPUs), both servers on the same CPUs; (floor run, target run) by
    (method, target), ``opts.contended_rounds`` each, which of the two starts first flipped
    every round.

    Why: the sequential rounds compare runs a second apart, and on a shared machine its speed
    moves by half within a second (their ratios range over 0.5 to 1.5). Run together, both
    meet the same machine at the same moments; the scheduler gives each an equal share of the
    CPUs, so their requests/s ratio is their ratio of CPU cost per request, the same ratio the
    sequential rounds estimate (bench/README.md has the two side by side) with a spread a
    fifth as wide."""
    out: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    if opts.wrk_cpus is None:
        # Not pinned (more than one worker): wrk would share the servers' CPUs, and the floor's,
        # answering more requests, would take more of them; the sequential ratio stands alone.
        return out
    floor_url, floor_server, _ = targets["floor"]
    for r in range(opts.contended_rounds):
        for method in ("tools/list", "server/discover"):
            for target, (url, server, _) in targets.items():
                if target == "floor":
                    continue
                log(f"[workers={n}] cached {method}: floor and {target} at once ({r + 1}/{opts.contended_rounds})")
                pair = [(floor_url, floor_server), (url, server)]
                order = pair if r % 2 == 0 else pair[::-1]
                runs = {
                    u: start_wrk(
                        fleet,
                        u,
                        method,
                        connections=opts.connections,
                        duration=opts.duration,
                        server=p,
                        cpus=opts.wrk_cpus,
                    )
                    for u, p in order
                }
                floor_run, target_run = (finish_wrk(fleet, runs[u]) for u, _ in pair)
                out.setdefault((method, target), []).append((floor_run, target_run))
    return out


def forwarding_runs(
    fleet: Fleet, n: int, direct_url: str, gw_url: str, off_url: str, opts: argparse.Namespace
) -> dict[str, Any]:
    forwarding: dict[str, Any] = {}
    cases = (
        ("tools/call", gw_url, {"name": CALL_NAME, "args": CALL_ARGS}),
        ("tools/list (caching off)", off_url, {}),
    )
    for label, via, extra in cases:
        method = label.split()[0]
        row: dict[str, Any] = {}
        runs: dict[str, list[dict[str, Any]]] = {}
        # Latency: direct and gateway, back to back, for `fwd_rounds` rounds; the added latency is the
        # median over rounds of (gateway - direct), so slow spells on the machine cancel out.
        plan = [("latency", 1)] * opts.fwd_rounds + [("throughput", opts.fwd_connections)]
        for i, (mode, conns) in enumerate(plan):
            pair = (("direct", direct_url), ("gateway", via))
            for target, url in pair if i % 2 == 0 else pair[::-1]:  # the order flips, as for cached runs
                log(f"[workers={n}] forwarding {label}: {target}, {conns} connection(s)")
                runs.setdefault(f"{target}_{mode}", []).append(
                    wrk(
                        fleet,
                        url,
                        method,
                        connections=conns,
                        duration=opts.fwd_duration,
                        name=extra.get("name"),
                        args=extra.get("args"),
                        cpus=opts.wrk_cpus,
                    )
                )
        for name, target_runs in runs.items():
            row[name] = median_run(target_runs)
            row[name]["p50_ms_all"] = [r["p50_ms"] for r in target_runs]
            row[name]["p99_ms_all"] = [r["p99_ms"] for r in target_runs]
        pairs = list(zip(runs["gateway_latency"], runs["direct_latency"], strict=True))
        row["added_p50_ms"] = round(statistics.median(g["p50_ms"] - d["p50_ms"] for g, d in pairs), 3)
        row["added_p99_ms"] = round(statistics.median(g["p99_ms"] - d["p99_ms"] for g, d in pairs), 3)
        row["direct_latency"]["p50_ms"] = statistics.median(d["p50_ms"] for _, d in pairs)
        row["direct_latency"]["p99_ms"] = statistics.median(d["p99_ms"] for _, d in pairs)
        row["gateway_latency"]["p50_ms"] = statistics.median(g["p50_ms"] for g, _ in pairs)
        row["gateway_latency"]["p99_ms"] = statistics.median(g["p99_ms"] for g, _ in pairs)
        row["throughput_ratio"] = round(row["gateway_throughput"]["rps"] / row["direct_throughput"]["rps"], 3)
        forwarding[label] = row
    return forwarding


# -- report -------------------------------------------------------------------------------------


def machine(loop_option: str) -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for pkg in ("aiohttp", "uvloop", "orjson", "mcp", "prometheus-client", "cachetools"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[pkg] = importlib.metadata.version(pkg)
    try:
        import uvloop  # noqa: F401

        loop = "uvloop" if loop_option != "asyncio" else "asyncio"
    except ImportError:
        loop = "asyncio"
    wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split("[")[0].strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "event_loop": loop,
        "packages": versions,
        "wrk": wrk_version,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def section(title: list[str], header: list[str], rows: list[str]) -> list[str]:
    """A titled markdown table, preceded by a blank line; nothing when there are no rows."""
    return ["", *title, "", *header, *rows] if rows else []


def tables(result: dict[str, Any]) -> str:
    conns = result["options"]["connections"]
    pins = [
        f"{w['workers']} worker: servers on CPU {w['cpus']['servers']}, wrk on CPU {w['cpus']['wrk']}"
        for w in result["workers"]
        if w.get("cpus")
    ]
    rows = []
    for w in result["workers"]:
        if "gateway" not in w.get("cached", {}).get("tools/list", {}):
            continue  # the cluster part alone: its rows are in the cluster table
        for method in ("tools/list", "server/discover"):
            c = w["cached"][method]
            g, f = c["gateway"], c["floor"]
            rows.append(
                f"| {w['workers']} | {method} ({c['response_bytes']} B) | {g['rps']:.0f} | {g['p50_ms']:.2f} | "
                f"{g['p99_ms']:.2f} | {f['rps']:.0f} | {f['p50_ms']:.2f} | {f['p99_ms']:.2f} | {c['ratio']:.2f} "
                f"({min(c['ratio_all']):.2f}-{max(c['ratio_all']):.2f}) "
                f"| {g['cpu_us_per_request']} / {f['cpu_us_per_request']} | {c['cpu_ratio']} "
                f"| {c['plain_ratio']:.2f} ({min(c['plain_ratio_all']):.2f}-{max(c['plain_ratio_all']):.2f}) |"
            )
    lines = section(
        [
            f"Cached path (wrk, 1 thread, {conns} connections; ratio = gateway/floor requests/s, same process count;"
            f" median of {result['options']['rounds']} rounds, floor, gateway, plain path (and with the cluster"
            " part and 1 worker, the gateway with [cluster]) back to back;"
            " plain path = the gateway without the hit path's speed-ups, --plain-path)",
            *(["Pinned: " + "; ".join(pins)] if pins else []),
        ],
        [
            "| workers | request | gateway req/s | p50 ms | p99 ms | floor req/s | floor p50 ms | floor p99 ms "
            "| ratio (rounds' range) | CPU µs/req gateway / floor | CPU ratio | plain path ratio (range) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ],
        rows,
    )
    rows = []
    for w in result["workers"]:
        if "ratio_contended" not in w.get("cached", {}).get("tools/list", {}):
            continue
        for method in ("tools/list", "server/discover"):
            c = w["cached"][method]
            cells = []
            for name in ("ratio", "plain_ratio", "cluster_ratio"):
                shared = c.get(f"{name}_contended_all")
                cells.append(f"{c[f'{name}_contended']:.2f} ({min(shared):.2f}-{max(shared):.2f})" if shared else "-")
            cpu = f"{c['gateway_contended_cpu_us']} / {c['floor_contended_cpu_us_gateway']}"
            rows.append(f"| {w['workers']} | {method} | {' | '.join(cells)} | {cpu} |")
    lines += section(
        [
            f"Cached path, contended (the floor and one gateway loaded at the same time, each by its own wrk, on the"
            f" same CPUs; ratio = gateway/floor requests/s, median of {result['options']['contended_rounds']} rounds;"
            " the figure the verdicts read)",
        ],
        [
            "| workers | request | gateway ratio (rounds' range) | plain path ratio (range) "
            "| [cluster] ratio (range) | CPU µs/req gateway / floor |",
            "|---|---|---:|---:|---:|---:|",
        ],
        rows,
    )
    rows = []
    for w in result["workers"]:
        for label, row in w.get("forwarding", {}).items():
            d, g = row["direct_latency"], row["gateway_latency"]
            rows.append(
                f"| {w['workers']} | {label} | {d['p50_ms']:.2f} / {d['p99_ms']:.2f} | {g['p50_ms']:.2f} / "
                f"{g['p99_ms']:.2f} | {row['added_p50_ms']:+.2f} / {row['added_p99_ms']:+.2f} | "
                f"{row['direct_throughput']['rps']:.0f} | {row['gateway_throughput']['rps']:.0f} | "
                f"{row['throughput_ratio']:.2f} |"
            )
    lines += section(
        [
            f"Forwarding (latency at 1 connection, medians of alternating rounds; throughput at "
            f"{result['options']['fwd_connections']} connections; direct = the SDK upstream itself)"
        ],
        [
            "| workers | request | direct p50/p99 ms | gateway p50/p99 ms | added p50/p99 ms | direct req/s | "
            "gateway req/s | ratio |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ],
        rows,
    )
    rows = []
    for w in result["workers"]:
        if "cold_burst" not in w:
            continue
        b = w["cold_burst"]
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(b["statuses"].items()))
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(b["cache_status"].items()))
        rows.append(
            f"| {w['workers']} | {b['upstream_requests']} | {statuses} | {kinds} | {b['wrong_ids']} | {b['seconds']} |"
        )
    lines += section(
        ["Cold burst (200 concurrent identical tools/list, empty cache; counted at the upstream)"],
        [
            "| workers | upstream requests | HTTP statuses | answered as | wrong ids | seconds |",
            "|---|---:|---|---|---:|---:|",
        ],
        rows,
    )
    m = result.get("memory")
    if m:
        lines += section(
            [f"Memory (1 worker; RSS growth over {m['entries']} stored entries)"],
            [
                "| entries stored | payload B/entry | RSS before MiB | RSS after MiB | RSS B/entry | ratio |",
                "|---:|---:|---:|---:|---:|---:|",
            ],
            [
                f"| {m['stored']} | {m['payload_bytes_per_entry']:.0f} | {m['rss_before_kib'] / 1024:.1f} | "
                f"{m['rss_after_kib'] / 1024:.1f} | {m['rss_bytes_per_entry']:.0f} | {m['ratio']:.2f} |"
            ],
        )
    lines += section(*cluster.table(result, TARGETS))
    lines += section(*stale.table(result, TARGETS))
    lines += section(*aggregate.table(result, TARGETS))
    lines += section(*reload.table(result, TARGETS))
    lines += section(*auth.table(result, TARGETS))
    mach = result["machine"]
    lines.append("")
    lines.append(
        f"Machine: {mach['cpu']}, {mach['cores']} cores, Linux {mach['kernel']}, Python {mach['python']}, "
        f"{mach['event_loop']}, aiohttp {mach['packages'].get('aiohttp')}, {mach['wrk']}; "
        f"load average at start {mach['loadavg_at_start'][0]}."
    )
    return "\n".join(lines[1:] if lines[:1] == [""] else lines)


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in result["workers"]:
        n = w["workers"]
        v: dict[str, bool] = {}
        if "gateway" in w.get("cached", {}).get("tools/list", {}):
            methods = ("tools/list", "server/discover")
            # The contended ratio where there is one (see contended_runs), else the sequential one.
            ratio = {m: w["cached"][m].get("ratio_contended", w["cached"][m]["ratio"]) for m in methods}
            least = TARGETS["cached_ratio_min"] if n == 1 else TARGETS["cached_ratio_min_workers"]
            v["cached_ratio_ok"] = all(ratio[m] >= least for m in methods)
            if "plain_ratio" in w["cached"]["tools/list"]:
                plain = {m: w["cached"][m].get("plain_ratio_contended", w["cached"][m]["plain_ratio"]) for m in methods}
                v["plain_ratio_ok"] = all(plain[m] >= TARGETS["plain_ratio_min"] for m in methods)
            v["cached_no_errors"] = all(
                w["cached"][m][t]["non_2xx"] == 0 and w["cached"][m][t]["socket_errors"] == 0
                for m in methods
                for t in ("gateway", "floor")
            )
        if "forwarding" in w:
            v["forward_added_p50_ok"] = all(
                r["added_p50_ms"] <= TARGETS["forward_added_p50_ms_max"] for r in w["forwarding"].values()
            )
        if "cold_burst" in w:
            made = w["cold_burst"]["upstream_requests"]
            # Each worker has its own cache: N workers may each fetch a cold key once, so the
            # single request is a verdict of one worker only.
            if n == 1:
                v["cold_burst_ok"] = made == TARGETS["cold_burst_upstream_requests"]
            v["cold_burst_at_most_one_per_worker"] = 1 <= made <= n
        if v:
            out[f"workers={n}"] = v
    cluster_verdicts = cluster.verdicts(result, TARGETS)
    if cluster_verdicts:
        out["cluster"] = cluster_verdicts
    refresh_verdicts = stale.verdicts(result, TARGETS)
    if refresh_verdicts:
        out["refresh"] = refresh_verdicts
    aggregate_verdicts = aggregate.verdicts(result, TARGETS)
    if aggregate_verdicts:
        out["aggregate"] = aggregate_verdicts
    reload_verdicts = reload.verdicts(result, TARGETS)
    if reload_verdicts:
        out["reload"] = reload_verdicts
    auth_verdicts = auth.verdicts(result, TARGETS)
    if auth_verdicts:
        out["auth"] = auth_verdicts
    m = result.get("memory")
    if m:
        out["memory_ok"] = m["ratio"] is not None and m["ratio"] <= TARGETS["memory_ratio_max"]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Gateway benchmark: ratios to a bare aiohttp floor, one run.")
    p.add_argument("--quick", action="store_true", help="short runs, 1 round, 2,000 memory entries (~1 min)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    p.add_argument("--duration", type=float, help="seconds per cached wrk run (default 1)")
    p.add_argument("--fwd-duration", type=float, help="seconds per forwarding wrk run (default 1; quick 2)")
    p.add_argument(
        "--rounds",
        type=int,
        help="floor/gateway rounds for cached runs, the order rotated each round (default 12; quick 1): the"
        " ratio is the median of the rounds' ratios; this machine's speed moves by half within a minute",
    )
    p.add_argument(
        "--contended-rounds",
        type=int,
        help="cached rounds with the floor and a gateway loaded at the same time on the same CPUs (default 10;"
        " quick 1): the contended ratio, the median of theirs, is the one the verdict reads",
    )
    p.add_argument(
        "--fwd-rounds",
        type=int,
        help="direct/gateway rounds for forwarding latency, the order flipped each round (default 9; quick 1):"
        " the added latency is their median; a 1-connection p50 moves by tenths of a ms from run to run here",
    )
    p.add_argument("--connections", type=int, default=32, help="wrk connections for cached runs (default 32)")
    p.add_argument("--fwd-connections", type=int, default=8, help="wrk connections, forwarding throughput")
    p.add_argument("--memory-entries", type=int, help="entries for the memory figure (default 10000; quick 2000)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory figure")
    p.add_argument(
        "--only",
        default="burst,cached,forwarding,cluster,refresh,aggregate,reload,auth",
        help="comma-separated parts: burst, cached, forwarding (per worker count), cluster (a redis-server, a"
        " gateway with [cluster] in the 1-worker cached rotation, then shared hits, a burst over 2 replicas and"
        " purges over 3, once), refresh (a hot key across many expiries, with and without refresh-ahead, once),"
        " aggregate (POST /mcp of two members against the per-upstream route on one 1-worker gateway, once),"
        " reload (20 config reloads of a 100-upstream 1-worker gateway under a steady load of hits, once),"
        " auth (warm lists for JWT, static and policy-filtered callers, and what a JWT or an introspected"
        " token costs, on one 1-worker gateway, once) (default all)",
    )
    p.add_argument("--log-level", default="info", help="gateway --log-level (default info: access log on)")
    p.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "uvloop", "asyncio"),
        help="event loop of the gateway and the floor alike (default auto: uvloop when installed)",
    )
    p.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="with 1 worker, do not run the floor and gateway on CPU 0 and wrk on the other CPUs",
    )
    p.add_argument(
        "--out",
        default=str(ROOT / "bench-results" / "latest.json"),
        help="where the JSON goes; the processes' logs go beside it, in STEM-logs/ (emptied first)",
    )
    opts = p.parse_args(argv)
    opts.worker_counts = [int(x) for x in opts.workers.split(",") if x.strip()]
    opts.wrk_cpus = None
    opts.parts = {x.strip() for x in opts.only.split(",") if x.strip()}
    opts.duration = opts.duration or (2.0 if opts.quick else 1.0)
    opts.fwd_duration = opts.fwd_duration or (2.0 if opts.quick else 1.0)
    opts.rounds = opts.rounds or (1 if opts.quick else 12)
    opts.contended_rounds = opts.contended_rounds or (1 if opts.quick else 10)
    opts.fwd_rounds = opts.fwd_rounds or (1 if opts.quick else 9)
    opts.memory_entries = opts.memory_entries or (2000 if opts.quick else 10_000)
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if shutil.which("wrk") is None:
        print("bench: wrk not found; run: bash scripts/install-bench-tools.sh", file=sys.stderr)
        return 2
    out_path = Path(opts.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Beside the JSON, named after it: emptied for this run, so it must be the bench's own.
    logs = out_path.with_name(f"{out_path.stem}-logs")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    started = time.time()
    result: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "machine": machine(opts.loop),
        "options": {
            "quick": opts.quick,
            "workers": opts.worker_counts,
            "duration_s": opts.duration,
            "fwd_duration_s": opts.fwd_duration,
            "rounds": opts.rounds,
            "contended_rounds": opts.contended_rounds,
            "fwd_rounds": opts.fwd_rounds,
            "connections": opts.connections,
            "fwd_connections": opts.fwd_connections,
            "gateway_log_level": opts.log_level,
            "loop": opts.loop,
            "command": " ".join([Path(sys.executable).name, "bench/run.py", *(argv or sys.argv[1:])]),
        },
        "targets": TARGETS,
    }
    with fleet_context(logs) as fleet, tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp:
        workdir = Path(tmp)
        up_port = free_port()
        log("starting the SDK upstream (25 tools)")
        up = fleet.start("upstream", [PY, str(BENCH / "upstream_25_tools.py"), str(up_port)])
        wait_ready(fleet, "upstream", up, lambda: fetch(up_port, "GET", "/_counts")[0] == 200)
        bodies: dict[str, Path] = {}
        for method in ("tools/list", "server/discover"):
            status, headers, body = mcp_call(up_port, "/mcp", method, 1)
            if status != 200 or not headers.get("content-type", "").startswith("application/json"):
                raise RuntimeError(f"upstream {method}: HTTP {status} {headers}")
            bodies[method] = workdir / f"{method.replace('/', '_')}.json"
            bodies[method].write_bytes(body)
        result["upstream"] = {
            "tools": len(json.loads(bodies["tools/list"].read_bytes())["result"]["tools"]),
            "tools_list_bytes": bodies["tools/list"].stat().st_size,
            "server_discover_bytes": bodies["server/discover"].stat().st_size,
        }
        redis_port = None
        if "cluster" in opts.parts:
            log("starting redis-server (persistence off) for the cluster part")
            redis, redis_port = cluster.start_redis(fleet, workdir)
        result["workers"] = []
        for n in opts.worker_counts:
            result["workers"].append(bench_workers(fleet, workdir, n, up_port, bodies, opts, redis_port))
        if redis_port is not None:
            result["cluster"] = cluster.run(fleet, workdir, up_port, redis_port, opts)
            fleet.stop(redis)
        if "refresh" in opts.parts:
            result["refresh"] = stale.run(fleet, workdir, opts)
        if "aggregate" in opts.parts:
            log("aggregate: POST /mcp of members a and b against /servers/a/mcp, one 1-worker gateway")
            result["aggregate"] = aggregate.run(fleet, workdir, up_port, opts, (CALL_NAME, CALL_ARGS))
        if "reload" in opts.parts:
            log("reload: config reloads of a 100-upstream 1-worker gateway under a steady load of hits")
            result["reload"] = reload.run(fleet, workdir, up_port, opts)
        if "auth" in opts.parts:
            log("auth: JWT, static and filtered callers; JWT and introspected token costs, one 1-worker gateway")
            result["auth"] = auth.run(fleet, workdir, up_port, opts)
        if not opts.no_memory:
            log(f"memory: storing {opts.memory_entries} entries of ~4 KB")
            result["memory"] = memory(fleet, workdir, opts.memory_entries, opts)
    result["seconds"] = round(time.time() - started, 1)
    result["verdicts"] = verdicts(result)
    result["table"] = tables(result)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    print()
    print(f"verdicts: {json.dumps(result['verdicts'])}")
    print(f"written: {out_path} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench: interrupted; every process it started is stopped", file=sys.stderr)
        sys.exit(130)
