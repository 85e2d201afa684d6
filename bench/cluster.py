"""``make bench``'s cluster part: gateway replicas with ``[cluster]`` on one real Redis.

bench/run.py starts one ``redis-server`` (:func:`start_redis`: a free 127.0.0.1 port, persistence
off) when the ``cluster`` part is on and stops it at the end. What is measured here:

  local tier     a replica with ``[cluster]`` is one more target in the cached rotation of
                 bench/run.py (``cached_runs``, 1 worker): the same wrk, floor and pinning, so its
                 ratio to the floor is measured like the others (:func:`start_cached_replica`);
  shared hit     replica A stores K distinct keys (``tools/list`` with distinct ``cursor``: the
                 SDK upstream ignores the cursor and answers its public 19 KB list), then replica
                 B asks for each key twice in a row on one keep-alive connection: the first answer
                 comes from Redis (``detail=shared``), the second from B's local tier; p50/p99 of
                 both, and the added p50;
  cold burst     200 concurrent identical requests for a cold key, half to A and half to B, all
                 sent in one loop pass: upstream requests (counted by the upstream) and each
                 request's latency against one upstream round trip measured directly;
  purge          three replicas hold the entry in their local tier; a purge on A; then B and C
                 are asked again and again until neither answers from its local tier: the time
                 from the purge's answer to that, per purge.

Every load is bounded in requests and time; replicas run 1 worker each and are stopped by the caller.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import socket
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    HOST,
    MCP_PATH,
    Conn,
    Fleet,
    fetch,
    free_port,
    gateway_argv,
    log,
    mcp_body,
    mcp_headers,
    metric,
    ms,
    percentile,
    read_response,
    run_async,
    upstream_counts,
    wait_ready,
)

PATH = MCP_PATH
ADMIN_TOKEN = "bench-cluster-admin-token-0123456789"
#: How long a replica may keep answering from the old entry after a purge before the bench gives up on it, s.
PURGE_GIVE_UP_S = 3.0


# -- Redis and replicas ------------------------------------------------------------------------------


def redis_ping(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=1) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")


def redis_version() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        return "none"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), out.strip())


def start_redis(fleet: Fleet, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A ``redis-server`` on a free 127.0.0.1 port, persistence off, in its own directory."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found (Debian package redis-server; scripts/install-tools.sh)")
    port = free_port()
    directory = workdir / "redis"
    directory.mkdir(exist_ok=True)
    argv = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(directory), "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"]
    proc = fleet.start("redis", argv)
    wait_ready(fleet, "redis", proc, lambda: redis_ping(port))
    return proc, port


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}{PATH}"


def write_config(path: Path, port: int, upstream_port: int, redis_port: int, prefix: str) -> None:
    path.write_text(
        f'[listener]\nhost = "{HOST}"\nport = {port}\n\n[admin]\ntoken = "{ADMIN_TOKEN}"\n\n'
        f'[cluster]\nredis_url = "redis://{HOST}:{redis_port}/0"\nkey_prefix = "{prefix}"\n\n'
        f'[upstreams.workspace]\nurl = "http://{HOST}:{upstream_port}/mcp"\n'
    )


def start_replicas(
    fleet: Fleet, workdir: Path, names: list[str], up_port: int, redis_port: int, prefix: str, opts: Any
) -> list[Replica]:
    """One 1-worker gateway per name, all with ``[cluster]`` on ``redis_port`` under ``prefix``;
    returned once each is ready and connected to Redis (``mcp_gateway_cluster_up`` 1)."""
    replicas = []
    for name in names:
        port = free_port()
        config = workdir / f"{name}.toml"
        write_config(config, port, up_port, redis_port, prefix)
        replicas.append(Replica(name, fleet.start(name, gateway_argv(config, 1, opts.log_level, opts.loop)), port))
    for r in replicas:
        wait_ready(fleet, r.name, r.proc, lambda r=r: fetch(r.port, "GET", "/readyz")[0] == 200)
        wait_ready(fleet, r.name, r.proc, lambda r=r: metric(r.port, "mcp_gateway_cluster_up") == 1)
    return replicas


def start_cached_replica(fleet: Fleet, workdir: Path, up_port: int, redis_port: int, opts: Any) -> Replica:
    """The replica for the cached rotation (its own key prefix: nothing else touches its keys)."""
    return start_replicas(fleet, workdir, ["gateway-1-cluster"], up_port, redis_port, "bench-cached", opts)[0]


# -- timed requests -------------------------------------------------------------------------------------


def kind(cache_status: str) -> str:
    """A Cache-Status in a word: ``hit`` (this replica's local tier), ``shared`` (from Redis),
    ``collapsed`` (waited for this replica's own miss), ``collapsed-shared`` (waited for
    another replica's leader), ``miss`` (went upstream), or the header itself."""
    parts = [p.strip() for p in cache_status.split(";")]
    if parts[:1] != ["mcp-gateway"]:
        return cache_status or "none"
    if "hit" in parts:
        shared = "detail=shared" in parts
        if "collapsed" in parts:
            return "collapsed-shared" if shared else "collapsed"
        return "shared" if shared else "hit"
    if "fwd=miss" in parts:
        return "miss"
    return cache_status


def _id_of(body: bytes) -> object:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message.get("id") if isinstance(message, dict) else None


# -- a hit from Redis against a local hit ---------------------------------------------------------------


async def _shared_vs_local(a: Replica, b: Replica, keys: int, warmup: int) -> dict[str, Any]:
    cursors = [f"shared-{i}" for i in range(warmup + keys)]
    stored: Counter[str] = Counter()
    async with Conn(a.port) as conn:
        for cursor in cursors:
            stored[kind((await conn.tools_list(cursor))[1])] += 1
    await asyncio.sleep(1.0)  # A writes to Redis in the background, after answering
    shared: list[float] = []
    local: list[float] = []
    unexpected: Counter[str] = Counter()
    async with Conn(b.port) as conn:
        for i, cursor in enumerate(cursors):
            first, first_cs, _ = await conn.tools_list(cursor, f"b-{i}")
            again, again_cs, _ = await conn.tools_list(cursor, f"b-{i}-again")
            if i < warmup:
                continue
            if kind(first_cs) == "shared" and kind(again_cs) == "hit":
                shared.append(first)
                local.append(again)
            else:
                unexpected[f"{kind(first_cs)} then {kind(again_cs)}"] += 1
    if not shared:
        raise RuntimeError(f"replica B gave no shared hit: {dict(unexpected)}")
    return {
        "keys": keys,
        "warmup_keys": warmup,
        "stored_on_a": dict(stored),
        "pairs": len(shared),
        "unexpected": dict(unexpected),
        "shared_p50_ms": ms(statistics.median(shared)),
        "shared_p99_ms": ms(percentile(shared, 99)),
        "local_p50_ms": ms(statistics.median(local)),
        "local_p99_ms": ms(percentile(local, 99)),
        "added_p50_ms": ms(statistics.median(shared) - statistics.median(local)),
        "added_p50_paired_ms": ms(statistics.median(s - lo for s, lo in zip(shared, local, strict=True))),
    }


# -- a cold burst over two replicas --------------------------------------------------------------------


async def _upstream_round_trip(up_port: int, count: int) -> list[float]:
    """Sequential ``tools/list`` straight to the upstream on one keep-alive connection, seconds each."""
    times = []
    async with Conn(up_port) as conn:
        body, headers = mcp_body("tools/list", 1), mcp_headers("tools/list")
        for _ in range(count):
            started = time.perf_counter()
            status, _, _ = await conn.post("/mcp", body, headers)
            times.append(time.perf_counter() - started)
            if status != 200:
                raise RuntimeError(f"upstream tools/list: HTTP {status}")
    return times[1:]  # the first one pays for the SDK's warm-up


async def _spread_burst(ports: list[int], count: int, cursor: str) -> list[tuple[int, dict[str, str], bytes, float]]:
    conns: list[Conn] = []
    try:
        for i in range(0, count, 50):  # connect first (in batches: accept backlog), send later
            batch = [Conn(ports[j % len(ports)]) for j in range(i, min(i + 50, count))]
            await asyncio.gather(*(c.__aenter__() for c in batch))
            conns += batch
        await asyncio.sleep(0.5)  # every connection accepted: only the requests race
        requests = [
            c.request(PATH, mcp_body("tools/list", f"burst-{i}", cursor=cursor), mcp_headers("tools/list"))
            for i, c in enumerate(conns)
        ]
        sent: list[float] = []
        for c, request in zip(conns, requests, strict=True):  # all sent in one loop pass
            assert c.writer is not None
            sent.append(time.perf_counter())
            c.writer.write(request)

        async def answer(c: Conn, at: float) -> tuple[int, dict[str, str], bytes, float]:
            assert c.reader is not None
            status, headers, body = await read_response(c.reader)
            return status, headers, body, time.perf_counter() - at

        return await asyncio.wait_for(asyncio.gather(*(answer(c, t) for c, t in zip(conns, sent, strict=True))), 60)
    finally:
        for c in conns:
            await c.__aexit__()


def cold_burst(replicas: list[Replica], up_port: int, rounds: int, count: int = 200) -> dict[str, Any]:
    rtt = run_async(_upstream_round_trip(up_port, 31))
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        before = upstream_counts(up_port)["tools/list"]
        responses = run_async(_spread_burst([x.port for x in replicas], count, f"burst-round-{r}"))
        made = upstream_counts(up_port)["tools/list"] - before
        latencies = [t for _, _, _, t in responses]
        wrong_ids = sum(1 for i, (_, _, body, _) in enumerate(responses) if _id_of(body) != f"burst-{i}")
        out.append(
            {
                "upstream_requests": made,
                "statuses": dict(Counter(str(s) for s, _, _, _ in responses)),
                "answered_as": dict(Counter(kind(h.get("cache-status", "")) for _, h, _, _ in responses)),
                "wrong_ids": wrong_ids,
                "p50_ms": ms(statistics.median(latencies)),
                "p99_ms": ms(percentile(latencies, 99)),
                "min_ms": ms(min(latencies)),
                "max_ms": ms(max(latencies)),
            }
        )
    mid = sorted(out, key=lambda x: x["p50_ms"])[(len(out) - 1) // 2]
    upstream_p50 = statistics.median(rtt)
    return {
        "requests": count,
        "replicas": len(replicas),
        "rounds": out,
        "upstream_requests_max": max(x["upstream_requests"] for x in out),
        "upstream_requests_all": [x["upstream_requests"] for x in out],
        "wrong_ids": sum(x["wrong_ids"] for x in out),
        "p50_ms": mid["p50_ms"],
        "p99_ms": mid["p99_ms"],
        "min_ms": mid["min_ms"],
        "answered_as": mid["answered_as"],
        "upstream_round_trip_p50_ms": ms(upstream_p50),
        "upstream_round_trip_p99_ms": ms(percentile(rtt, 99)),
        "p50_over_round_trip": round(mid["p50_ms"] / (upstream_p50 * 1000), 2),
    }


# -- purge to consistency --------------------------------------------------------------------------------


async def _purge_rounds(replicas: list[Replica], rounds: int) -> dict[str, Any]:
    """``rounds`` purges on the first replica; after each, the others are polled (each on its
    own connection, concurrently, back to back) until they no longer answer from their local
    tier. Two times per purge, from the purge's answer: until the first such poll was *sent*
    (it reached the replica at once: the replica had dropped the entry by then, within the
    poll's transit) and until it was *answered* (that answer is a miss: it waits for an upstream
    round trip, or for another replica's). Per purge, the later of the polled replicas counts."""
    cursor = "purge"
    purge_path = "/admin/cache/purge?upstream=workspace&method=tools/list"
    admin_headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    by_answer: list[float] = []
    by_send: list[float] = []
    per_replica: dict[str, list[float]] = {r.name: [] for r in replicas[1:]}
    purge_answer: list[float] = []
    polls: list[int] = []
    seen_after: Counter[str] = Counter()
    gave_up = 0

    async def poll(c: Conn, answered: float) -> tuple[float, float, int, str]:
        n = 0
        while True:
            n += 1
            sent = time.perf_counter()
            _, cs, _ = await c.tools_list(cursor)
            now = time.perf_counter()
            if kind(cs) != "hit":  # anything but the local tier's (old) entry
                return now - answered, sent - answered, n, kind(cs)
            if now - answered > PURGE_GIVE_UP_S:
                return math.inf, math.inf, n, "old entry still served"

    conns = [Conn(r.port) for r in replicas]
    admin = Conn(replicas[0].port)
    for c in (*conns, admin):
        await c.__aenter__()
    try:
        for _ in range(rounds):
            for r, c in zip(replicas, conns, strict=True):  # the entry in every replica's local tier
                for _attempt in range(10):
                    if kind((await c.tools_list(cursor))[1]) == "hit":
                        break
                else:
                    raise RuntimeError(f"{r.name}: tools/list never became a local hit")
            started = time.perf_counter()
            status, _, body = await admin.post(purge_path, b"", admin_headers)
            answered = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"purge: HTTP {status} {body[:200]!r}")
            purge_answer.append(answered - started)
            results = await asyncio.gather(*(poll(c, answered) for c in conns[1:]))
            for r, (t, _, n, what) in zip(replicas[1:], results, strict=True):
                per_replica[r.name].append(t)
                polls.append(n)
                seen_after[what] += 1
            by_answer.append(max(t for t, _, _, _ in results))
            by_send.append(max(t for _, t, _, _ in results))
            gave_up += by_answer[-1] == math.inf
    finally:
        for c in (*conns, admin):
            await c.__aexit__()
    return {
        "replicas": len(replicas),
        "purges": rounds,
        "p50_ms": ms(statistics.median(by_answer)),
        "p99_ms": ms(percentile(by_answer, 99)),
        "max_ms": ms(max(by_answer)),
        "sent_p50_ms": ms(statistics.median(by_send)),
        "sent_p99_ms": ms(percentile(by_send, 99)),
        "per_replica_p50_ms": {k: ms(statistics.median(v)) for k, v in per_replica.items()},
        "purge_answer_p50_ms": ms(statistics.median(purge_answer)),
        "purge_answer_p99_ms": ms(percentile(purge_answer, 99)),
        "polls_until_consistent_max": max(polls),
        "first_answer_after": dict(seen_after),
        "gave_up": gave_up,
    }


# -- the whole part ---------------------------------------------------------------------------------------


def run(fleet: Fleet, workdir: Path, up_port: int, redis_port: int, opts: Any) -> dict[str, Any]:
    """Shared hit, cold burst and purge, on three fresh replicas (A, B, C) sharing one key prefix."""
    names = ["replica-a", "replica-b", "replica-c"]
    log("cluster: starting replicas A, B and C")
    replicas = start_replicas(fleet, workdir, names, up_port, redis_port, "bench-cluster", opts)
    a, b, _c = replicas
    out: dict[str, Any] = {"redis": redis_version()}
    try:
        keys = 300 if opts.quick else 2000
        log(f"cluster: {keys} keys stored on A, then each asked twice on B (from Redis, then local)")
        out["shared_hit"] = run_async(_shared_vs_local(a, b, keys, warmup=50))
        rounds = 1 if opts.quick else 5
        log(f"cluster: cold burst, 200 concurrent tools/list over A and B ({rounds} round(s))")
        out["cold_burst"] = cold_burst([a, b], up_port, rounds)
        purges = 10 if opts.quick else 50
        log(f"cluster: {purges} purges on A, B and C polled until neither serves the old entry")
        out["purge"] = run_async(_purge_rounds(replicas, purges))
        out["cluster_up_after"] = [metric(r.port, "mcp_gateway_cluster_up") for r in replicas]
    finally:
        for r in replicas:
            fleet.stop(r.proc)
    return out


# -- report -------------------------------------------------------------------------------------------------


def table(result: dict[str, Any], targets: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The "Cluster (Redis)" table: its title, header and rows (no rows without the cluster part)."""
    c = result.get("cluster")
    rows: list[tuple[str, str, str]] = []
    for w in result["workers"]:
        for method in ("tools/list", "server/discover"):
            row = w.get("cached", {}).get(method)
            if row is None or "cluster_ratio" not in row:
                continue
            g = row["cluster"]
            against = ""
            if "gateway" in row:  # the same gateway without [cluster], in the same rounds
                ratios = [c / p for c, p in zip(g["rps_all"], row["gateway"]["rps_all"], strict=True)]
                against = f"; to the gateway without [cluster]: {statistics.median(ratios):.2f}"
            # The verdict reads the contended ratio where there is one (the contended table).
            contended = row.get("cluster_ratio_contended")
            read = "" if contended is None else f"contended {contended:.2f} (the verdict's); "
            rows.append(
                (
                    f"{w['workers']} worker, `{method}` from the local tier, ratio to the floor (rounds)",
                    f"{read}sequential {row['cluster_ratio']:.2f} ({min(row['cluster_ratio_all']):.2f}-"
                    f"{max(row['cluster_ratio_all']):.2f}){against}; {g['rps']:.0f} req/s,"
                    f" p50 {g['p50_ms']:.2f} ms, p99 {g['p99_ms']:.2f} ms, CPU {g['cpu_us_per_request']} µs/req",
                    f">= {targets['cluster_cached_ratio_min']}",
                )
            )
    if c:
        s, b, p = c["shared_hit"], c["cold_burst"], c["purge"]
        rows += [
            (
                f"hit from Redis on B (local tier cold), {s['pairs']} keys, 1 connection: p50 / p99 ms",
                f"{s['shared_p50_ms']:.3f} / {s['shared_p99_ms']:.3f}",
                "",
            ),
            (
                "local hit on B, same keys, just after: p50 / p99 ms",
                f"{s['local_p50_ms']:.3f} / {s['local_p99_ms']:.3f}",
                "",
            ),
            (
                "added p50 of a hit from Redis (paired median)",
                f"{s['added_p50_ms']:+.3f} ms ({s['added_p50_paired_ms']:+.3f})",
                f"<= {targets['cluster_shared_added_p50_ms_max']} ms",
            ),
            (
                f"cold burst, {b['requests']} over {b['replicas']} replicas: upstream requests (rounds)",
                f"{b['upstream_requests_max']} ({', '.join(map(str, b['upstream_requests_all']))});"
                f" wrong ids {b['wrong_ids']}",
                f"{targets['cluster_burst_upstream_requests']}",
            ),
            (
                "cold burst latency p50 / p99 ms (median round)"
                + (" / fastest" if "min_ms" in b else "")
                + ", answered as",
                f"{b['p50_ms']:.1f} / {b['p99_ms']:.1f}"
                + (f" / {b['min_ms']:.1f}" if "min_ms" in b else "")
                + "; "
                + ", ".join(f"{k}: {v}" for k, v in sorted(b["answered_as"].items())),
                "",
            ),
            (
                "one upstream round trip (direct, 1 connection): p50 / p99 ms; burst p50 over it",
                f"{b['upstream_round_trip_p50_ms']:.2f} / {b['upstream_round_trip_p99_ms']:.2f};"
                f" {b['p50_over_round_trip']:.1f}x",
                "",
            ),
            (
                f"purge on A to consistency on B and C, {p['purges']} purges: p50 / p99 / max ms"
                " (until both answered without the old entry)",
                f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f} / {p['max_ms']:.2f}",
                f"p99 <= {targets['cluster_purge_p99_ms_max']} ms",
            ),
            (
                "the same, until the first such request was sent: p50 / p99 ms; the purge's own answer p50 / p99 ms",
                f"{p['sent_p50_ms']:.2f} / {p['sent_p99_ms']:.2f}; "
                f"{p['purge_answer_p50_ms']:.2f} / {p['purge_answer_p99_ms']:.2f}",
                "",
            ),
        ]
    redis = c["redis"] if c else redis_version() if rows else ""
    title = [
        f"Cluster (Redis {redis} on 127.0.0.1, persistence off; replicas with [cluster], 1 worker each;"
        " local-tier rows: one more target in the cached rotation above)"
    ]
    header = ["| measure | figure | target |", "|---|---|---|"]
    return title, header, [f"| {m} | {f} | {t} |" for m, f, t in rows]


def verdicts(result: dict[str, Any], targets: dict[str, Any]) -> dict[str, bool]:
    v: dict[str, bool] = {}
    for w in result["workers"]:
        cached = w.get("cached", {})
        ratios = [  # the contended ratio where there is one (bench/run.py, contended_runs)
            cached[m].get("cluster_ratio_contended", cached[m]["cluster_ratio"])
            for m in ("tools/list", "server/discover")
            if "cluster_ratio" in cached.get(m, {})
        ]
        if ratios:
            v[f"cached_ratio_ok_workers={w['workers']}"] = min(ratios) >= targets["cluster_cached_ratio_min"]
    c = result.get("cluster")
    if c:
        v["shared_added_p50_ok"] = c["shared_hit"]["added_p50_ms"] <= targets["cluster_shared_added_p50_ms_max"]
        v["cold_burst_ok"] = c["cold_burst"]["upstream_requests_max"] == targets["cluster_burst_upstream_requests"]
        v["cold_burst_ids_ok"] = c["cold_burst"]["wrong_ids"] == 0
        v["purge_p99_ok"] = c["purge"]["p99_ms"] <= targets["cluster_purge_p99_ms_max"]
    return v
