"""``make bench``'s refresh part: a hot key across many expiries, with and without
refresh-ahead.

Usage as the upstream: python bench/stale.py serve PORT TTL_MS LATENCY_MS -> http://127.0.0.1:PORT/mcp

The upstream is a scripted aiohttp server: every ``tools/list`` waits ``LATENCY_MS`` (a backend
behind it), then answers one public tool with ``ttlMs`` ``TTL_MS``; ``GET /_counts`` ->
``{"tools/list": N}``. Two 1-worker gateways on it, one with ``refresh_ahead = true``, are
measured one after the other: ``CONNECTIONS`` keep-alive connections each ask ``tools/list``
(one key) every :data:`PAUSE_S` for ``TTLS`` lifetimes. Per gateway: p50, p99 and max latency
of every answer, how the answers were served (a miss waits a whole upstream round trip, and
the callers arriving meanwhile wait with it: the spike refresh-ahead should remove), and
upstream requests per lifetime (counted by the upstream).

Refresh-ahead starts in the last 10% of a lifetime but at least its last second, and never in
its first half (gateway/cache/policy.py): with a 1 s ``ttlMs`` it refreshes at half-life, so
about two upstream requests per lifetime rather than one.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    BENCH,
    HOST,
    PY,
    Conn,
    Fleet,
    fetch,
    free_port,
    gateway_argv,
    log,
    ms,
    percentile,
    run_async,
    upstream_counts,
    wait_ready,
)

#: Lifetime of the upstream's answers, in ms.
TTL_MS = 1000
#: The upstream's time to answer, in ms.
LATENCY_MS = 10
#: Connections asking for the hot key at once; each waits this long between requests, s.
CONNECTIONS = 8
PAUSE_S = 0.01


# -- the upstream ----------------------------------------------------------------------------------------


def make_upstream(ttl_ms: int, latency_ms: int) -> web.Application:
    counts: Counter[str] = Counter()

    async def mcp(request: web.Request) -> web.Response:
        msg = orjson.loads(await request.read())
        method = msg.get("method", "")
        counts[method] += 1
        if method != "tools/list":
            error = {"code": -32601, "message": f"method {method!r} not served by this benchmark upstream"}
            return web.Response(
                body=orjson.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "error": error}),
                content_type="application/json",
            )
        await asyncio.sleep(latency_ms / 1000)
        result = {
            "tools": [{"name": "hot", "inputSchema": {"type": "object"}}],
            "resultType": "complete",
            "cacheScope": "public",
            "ttlMs": ttl_ms,
        }
        return web.Response(
            body=orjson.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "result": result}),
            content_type="application/json",
        )

    async def get_counts(request: web.Request) -> web.Response:
        return web.json_response(dict(counts))

    app = web.Application()
    app.router.add_post("/mcp", mcp)
    app.router.add_get("/_counts", get_counts)
    return app


# -- the load --------------------------------------------------------------------------------------------


def kind(cache_status: str) -> str:
    """A Cache-Status in a word: ``hit``, ``collapsed`` (waited for another caller's miss),
    ``miss``, ``stale``, or the header itself."""
    parts = [p.strip() for p in cache_status.split(";")]
    if "hit" in parts:
        if any(p.startswith("ttl=-") for p in parts):
            return "stale"
        return "collapsed" if "collapsed" in parts else "hit"
    if "fwd=miss" in parts:
        return "miss"
    return cache_status or "none"


async def _hot_key(port: int, seconds: float) -> tuple[list[float], Counter[str]]:
    latencies: list[float] = []
    kinds: Counter[str] = Counter()
    deadline = time.perf_counter() + seconds

    async def one(i: int) -> None:
        async with Conn(port) as conn:
            n = 0
            while time.perf_counter() < deadline:
                elapsed, cache_status, _ = await conn.tools_list("hot", f"c{i}-{n}")
                latencies.append(elapsed)
                kinds[kind(cache_status)] += 1
                n += 1
                await asyncio.sleep(PAUSE_S)

    await asyncio.gather(*(one(i) for i in range(CONNECTIONS)))
    return latencies, kinds


def write_config(path: Path, port: int, upstream_port: int, refresh_ahead: bool) -> None:
    path.write_text(
        f'[listener]\nhost = "{HOST}"\nport = {port}\n\n[registry]\nenabled = false\n\n'
        f'[upstreams.workspace]\nurl = "http://{HOST}:{upstream_port}/mcp"\n'
        f"refresh_ahead = {'true' if refresh_ahead else 'false'}\n"
    )


def run(fleet: Fleet, workdir: Path, opts: Any) -> dict[str, Any]:
    """The hot key on a gateway without refresh-ahead, then on one with it."""
    ttls = 6 if opts.quick else 20
    up_port = free_port()
    argv = [PY, str(BENCH / "stale.py"), "serve", str(up_port), str(TTL_MS), str(LATENCY_MS)]
    up = fleet.start("refresh-upstream", argv)
    wait_ready(fleet, "refresh-upstream", up, lambda: fetch(up_port, "GET", "/_counts")[0] == 200)
    out: dict[str, Any] = {
        "ttl_ms": TTL_MS,
        "upstream_latency_ms": LATENCY_MS,
        "connections": CONNECTIONS,
        "pause_ms": PAUSE_S * 1000,
        "lifetimes": ttls,
    }
    try:
        for label, refresh_ahead in (("without", False), ("with", True)):
            port = free_port()
            config = workdir / f"refresh-{label}.toml"
            write_config(config, port, up_port, refresh_ahead)
            name = f"gateway-refresh-{label}"
            proc = fleet.start(name, gateway_argv(config, 1, opts.log_level, opts.loop))
            try:
                wait_ready(fleet, name, proc, lambda port=port: fetch(port, "GET", "/readyz")[0] == 200)
                log(f"refresh: a hot key over {ttls} lifetimes of {TTL_MS} ms, {label} refresh-ahead")
                run_async(_hot_key(port, 0.2))  # the entry stored, the connections warm
                before = upstream_counts(up_port)["tools/list"]
                latencies, kinds = run_async(_hot_key(port, ttls * TTL_MS / 1000))
                made = upstream_counts(up_port)["tools/list"] - before
            finally:
                fleet.stop(proc)
            out[label] = {
                "requests": len(latencies),
                "p50_ms": ms(statistics.median(latencies)),
                "p99_ms": ms(percentile(latencies, 99)),
                "max_ms": ms(max(latencies)),
                "answered_as": dict(kinds),
                "upstream_requests": made,
                "upstream_requests_per_ttl": round(made / ttls, 2),
            }
    finally:
        fleet.stop(up)
    return out


# -- report -------------------------------------------------------------------------------------------------


def table(result: dict[str, Any], targets: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The "Refresh-ahead" table: its title, header and rows (no rows without the refresh part)."""
    r = result.get("refresh")
    if not r:
        return [], [], []
    title = [
        f"Refresh-ahead (a hot key over {r['lifetimes']} lifetimes of {r['ttl_ms']} ms; upstream answers in"
        f" {r['upstream_latency_ms']} ms; {r['connections']} connections, each a request every"
        f" {r['pause_ms']:g} ms after the last answer; 1 worker)"
    ]
    header = [
        "| refresh-ahead | requests | p50 ms | p99 ms | max ms | answered as | upstream requests (per lifetime) |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    rows = []
    for label in ("without", "with"):
        x = r[label]
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(x["answered_as"].items()))
        rows.append(
            f"| {label} | {x['requests']} | {x['p50_ms']:.2f} | {x['p99_ms']:.2f} | {x['max_ms']:.2f} | {kinds} |"
            f" {x['upstream_requests']} ({x['upstream_requests_per_ttl']:.2f}) |"
        )
    rows.append(
        f"| target (with) | | | < {r['upstream_latency_ms']} (the upstream's latency) | |"
        f" {targets['refresh_misses']} misses | <= {targets['refresh_upstream_per_ttl_max']} |"
    )
    return title, header, rows


def verdicts(result: dict[str, Any], targets: dict[str, Any]) -> dict[str, bool]:
    r = result.get("refresh")
    if not r:
        return {}
    w = r["with"]
    misses = w["answered_as"].get("miss", 0) + w["answered_as"].get("collapsed", 0)
    return {
        "no_misses_ok": misses == targets["refresh_misses"],
        "p99_under_upstream_latency_ok": w["p99_ms"] < r["upstream_latency_ms"],
        "upstream_per_ttl_ok": w["upstream_requests_per_ttl"] <= targets["refresh_upstream_per_ttl_max"],
    }


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "serve":
        raise SystemExit(f"usage: {sys.argv[0]} serve PORT TTL_MS LATENCY_MS")
    port, ttl_ms, latency_ms = (int(x) for x in sys.argv[2:])
    web.run_app(make_upstream(ttl_ms, latency_ms), host=HOST, port=port, access_log=None, print=None)
