"""``make bench``'s reload part: config reloads under a steady load of cached hits.

One 1-worker gateway with 100 upstreams (``u000`` ... ``u099``), every one on bench/run.py's
25-tool SDK upstream, and an ``[admin]`` token. wrk (bench/mcp.lua) sends warm ``tools/list``
hits to ``/servers/u000/mcp`` at ``--connections``, in :data:`PAIRS` pairs of runs of
:data:`RUN_S` s (quick: :data:`QUICK_PAIRS`, :data:`QUICK_RUN_S`), the order flipped every pair: a
quiet run, and a run during which this script makes :data:`RELOADS_PER_RUN` reloads, evenly spaced
(20 in all; quick 10). Each reload replaces the config file in one step (as the kubelet swaps a
ConfigMap volume's files) with ``u050``'s ``timeout_s`` changed (retuned: it keeps its entries)
and ``u100`` added or removed in turn (added: probed at once; removed: its entries dropped), then
calls ``POST /admin/reload`` and checks its answer (200, that diff).

Measured:

  reloads  each ``POST /admin/reload``'s round trip (read and validate the file, apply it, answer),
           in ms; the apply time of its log line (``config reloaded (... applied in X ms)``: the
           one step with no await); and, in this process on wrk's CPUs, the time
           :func:`gateway.config.read_config` (check-config's code, which the reload runs first, in
           the gateway's event loop too) takes on the 101-upstream file, median of 20, in ms;
  hits     requests/s, p50, p99, p99.9 and max (ms) of the quiet and the reloading runs; the
           **added p99** is the median over pairs of (reloading p99 - quiet p99). Target: at most
           2 ms. The upstream's own ``tools/list`` count must not move (hits only), and no answer
           may be other than 200.

With 1 worker and 2+ CPUs (and ``--pin``, the default) the gateway runs on the first CPU and wrk on
the others; this script's reloads run on wrk's CPUs. Bounded: :data:`PAIRS` x 2 runs, one thread of
reloads per reloading run, joined before the next run. Binds 127.0.0.1 only; the gateway is stopped
at the end (bench/run.py's fleet stops it on error or Ctrl-C too).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from harness import (
    HOST,
    Fleet,
    fetch,
    free_port,
    gateway_argv,
    log,
    mcp_call,
    set_group_affinity,
    upstream_counts,
    wait_ready,
    wrk,
)

from gateway.config import read_config

UPSTREAMS = 100
LOADED = "u000"  # the upstream the hits go to
RETUNED = "u050"  # the upstream whose timeout every reload changes
TOGGLED = "u100"  # the upstream every reload adds or removes in turn
ADMIN_TOKEN = "bench-reload-admin-token-0123456789"
PAIRS, RUN_S = 4, 3.0
QUICK_PAIRS, QUICK_RUN_S = 2, 2.0
RELOADS_PER_RUN = 5
LEAD_S = 0.3  # into a reloading run before its first reload: wrk connected and at speed
SIDES = ("quiet", "reloading")
_APPLIED = re.compile(r"config reloaded \(sha256 [0-9a-f]+, applied in ([0-9.]+) ms\)")


def config_text(port: int, up_port: int, *, timeout_s: float, toggled: bool) -> str:
    """The gateway's config: 100 upstreams (101 with ``toggled``), ``RETUNED`` with ``timeout_s``."""
    parts = [f'[listener]\nhost = "{HOST}"\nport = {port}\n\n[admin]\ntoken = "{ADMIN_TOKEN}"\n']
    names = [f"u{i:03d}" for i in range(UPSTREAMS)] + ([TOGGLED] if toggled else [])
    for name in names:
        timeout = f"timeout_s = {timeout_s:g}\n" if name == RETUNED else ""
        parts.append(f'\n[upstreams.{name}]\nurl = "http://{HOST}:{up_port}/mcp"\n{timeout}')
    return "".join(parts)


def replace_file(path: Path, text: str) -> None:
    """``text`` as ``path``, in one step: a reader sees the old file or the new one, never half."""
    staged = path.with_suffix(".staged")
    staged.write_text(text)
    os.replace(staged, path)


class Reloads:
    """The reloads of this part, numbered from 1: reload ``i`` sets ``RETUNED``'s ``timeout_s`` to
    ``30 + i`` s and adds ``TOGGLED`` (``i`` odd) or removes it (``i`` even)."""

    def __init__(self, path: Path, port: int, up_port: int) -> None:
        self.path, self.port, self.up_port = path, port, up_port
        self.done: list[dict[str, Any]] = []

    def one(self) -> None:
        i = len(self.done) + 1
        toggled = i % 2 == 1
        replace_file(self.path, config_text(self.port, self.up_port, timeout_s=30 + i, toggled=toggled))
        started = time.perf_counter()
        status, _, body = fetch(self.port, "POST", "/admin/reload", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        took_ms = (time.perf_counter() - started) * 1000
        answer = json.loads(body) if body.startswith(b"{") else {}
        expected = {
            "reloaded": True,
            "added": [TOGGLED] if toggled else [],
            "removed": [] if toggled else [TOGGLED],
            "changed": [],
            "retuned": [RETUNED],
        }
        ok = status == 200 and all(answer.get(k) == v for k, v in expected.items())
        self.done.append({"status": status, "round_trip_ms": round(took_ms, 3), "ok": ok, "answer": answer})
        if not ok:
            log(f"reload: reload {i} answered HTTP {status}: {body[:300]!r}")

    def during(self, count: int, run_s: float) -> threading.Thread:
        """A thread making ``count`` reloads evenly over a run of ``run_s`` s that starts now."""
        spacing = (run_s - 2 * LEAD_S) / max(1, count - 1)

        def reloads() -> None:
            start = time.monotonic() + LEAD_S
            for k in range(count):
                time.sleep(max(0.0, start + k * spacing - time.monotonic()))
                self.one()

        thread = threading.Thread(target=reloads, name="reloads", daemon=True)
        thread.start()
        return thread


def cpu_plan(opts: Any) -> tuple[set[int] | None, set[int] | None]:
    """(the gateway's CPUs, wrk's CPUs): as bench/run.py's cpu_plan for 1 worker."""
    cpus = sorted(os.sched_getaffinity(0))
    if not opts.pin or len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rps": statistics.median(r["rps"] for r in runs),
        **{f"{q}_ms": statistics.median(r[f"{q}_ms"] for r in runs) for q in ("p50", "p99", "p999", "max")},
        "p99_ms_all": [r["p99_ms"] for r in runs],
        "max_ms_all": [r["max_ms"] for r in runs],
        "requests": sum(r["requests"] for r in runs),
        "non_2xx": sum(r["non_2xx"] for r in runs),
        "socket_errors": sum(r["socket_errors"] for r in runs),
    }


def run(fleet: Fleet, workdir: Path, up_port: int, opts: Any) -> dict[str, Any]:
    """The quiet and reloading runs on one fresh 1-worker gateway of 100 upstreams on ``up_port``."""
    pairs, run_s = (QUICK_PAIRS, QUICK_RUN_S) if opts.quick else (PAIRS, RUN_S)
    port = free_port()
    config = workdir / "gateway-reload.toml"
    config.write_text(config_text(port, up_port, timeout_s=30, toggled=False))
    name = "gateway-reload"
    proc = fleet.start(name, gateway_argv(config, 1, opts.log_level, opts.loop))
    url = f"http://{HOST}:{port}/servers/{LOADED}/mcp"
    reloads = Reloads(config, port, up_port)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    server_cpus, wrk_cpus = cpu_plan(opts)
    every_cpu = os.sched_getaffinity(0)
    out: dict[str, Any] = {"workers": 1, "upstreams": UPSTREAMS, "connections": opts.connections}
    try:
        wait_ready(fleet, name, proc, lambda: fetch(port, "GET", "/readyz")[0] == 200)
        for i in range(20):
            mcp_call(port, f"/servers/{LOADED}/mcp", "tools/list", i)
        status, headers, _ = mcp_call(port, f"/servers/{LOADED}/mcp", "tools/list", "check-hit")
        out["warm_cache_status"] = headers.get("cache-status", "")
        if status != 200 or not out["warm_cache_status"].startswith("mcp-gateway; hit"):
            raise RuntimeError(f"reload: the warm tools/list is not a hit: HTTP {status} {out['warm_cache_status']}")
        if server_cpus:
            set_group_affinity(proc.pid, server_cpus)
        before = upstream_counts(up_port)
        try:
            for p in range(pairs):
                for side in SIDES if p % 2 == 0 else SIDES[::-1]:
                    log(f"reload: hits on {LOADED}, {side} (pair {p + 1}/{pairs})")
                    thread = reloads.during(RELOADS_PER_RUN, run_s) if side == "reloading" else None
                    runs[side].append(
                        wrk(
                            fleet,
                            url,
                            "tools/list",
                            connections=opts.connections,
                            duration=run_s,
                            server=proc,
                            cpus=wrk_cpus,
                        )
                    )
                    if thread is not None:
                        thread.join(60)
                        if thread.is_alive():
                            raise RuntimeError("reload: the reloads did not end within 60 s")
        finally:
            if server_cpus:
                set_group_affinity(proc.pid, every_cpu)
        out["upstream_requests_during"] = dict(upstream_counts(up_port) - before)
    finally:
        fleet.stop(proc)
    parse_ms = []
    for _ in range(20):
        started = time.perf_counter()
        read_config(config)
        parse_ms.append((time.perf_counter() - started) * 1000)
    applied = [float(x) for x in _APPLIED.findall((fleet.logs / f"{name}.log").read_text(errors="replace"))]
    trips = [r["round_trip_ms"] for r in reloads.done]
    out.update(
        {
            "pairs": pairs,
            "run_s": run_s,
            "cpus": {"gateway": sorted(server_cpus), "wrk": sorted(wrk_cpus or ())} if server_cpus else None,
            "reloads": len(reloads.done),
            "reloads_ok": sum(r["ok"] for r in reloads.done),
            "round_trip_ms": {"p50": statistics.median(trips), "max": max(trips)} if trips else None,
            "applied_ms": {"p50": statistics.median(applied), "max": max(applied)} if applied else None,
            "applied_ms_all": applied,
            "read_config_ms": round(statistics.median(parse_ms), 2),
            "quiet": _side(runs["quiet"]),
            "reloading": _side(runs["reloading"]),
        }
    )
    diffs = [r["p99_ms"] - q["p99_ms"] for q, r in zip(runs["quiet"], runs["reloading"], strict=True)]
    out["added_p99_ms"] = round(statistics.median(diffs), 3)
    out["added_p99_ms_all"] = [round(d, 3) for d in diffs]
    return out


# -- report -------------------------------------------------------------------------------------------------


def _hits(x: dict[str, Any]) -> str:
    return (
        f"{x['rps']:.0f} req/s, p50 {x['p50_ms']:.2f}, p99 {x['p99_ms']:.2f}, p99.9 {x['p999_ms']:.2f},"
        f" max {x['max_ms']:.2f} ms"
    )


def table(result: dict[str, Any], targets: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The "Config reload" table: its title, header and rows (no rows without the reload part)."""
    g = result.get("reload")
    if not g or "quiet" not in g:
        return [], [], []
    pin = f"; gateway on CPU {g['cpus']['gateway']}, wrk on CPU {g['cpus']['wrk']}" if g["cpus"] else ""
    title = [
        f"Config reload (1 worker, {g['upstreams']} upstreams on the 25-tool SDK upstream; hits: wrk, 1 thread,"
        f" {g['connections']} connections on `/servers/{LOADED}/mcp`, {g['pairs']} pairs of {g['run_s']:g} s runs,"
        f" quiet and with {RELOADS_PER_RUN} reloads, the order flipped each pair{pin}; each reload retunes"
        f" `{RETUNED}`'s `timeout_s` and adds or removes `{TOGGLED}`)"
    ]
    header = ["| measure | figure | target |", "|---|---|---|"]
    trip, applied = g["round_trip_ms"] or {}, g["applied_ms"] or {}
    ups = g["upstream_requests_during"]
    rows = [
        (
            "reloads made; answered 200 with the expected diff",
            f"{g['reloads']}; {g['reloads_ok']}",
            f"{g['reloads']}",
        ),
        (
            "`POST /admin/reload` round trip (read, validate, apply), p50 / max",
            f"{trip.get('p50', 0):.1f} / {trip.get('max', 0):.1f} ms",
            "",
        ),
        (
            "of which: read and validate the file (`read_config`, timed in the bench process), median",
            f"{g['read_config_ms']:.1f} ms",
            "",
        ),
        (
            "of which: applied in (the gateway's log line), p50 / max",
            f"{applied.get('p50', 0):.1f} / {applied.get('max', 0):.1f} ms ({len(g['applied_ms_all'])} lines)",
            "",
        ),
        ("hits, quiet runs (medians)", _hits(g["quiet"]), ""),
        ("hits, runs with reloads (medians)", _hits(g["reloading"]), ""),
        (
            "added p99 during reloads, median of pairs (all)",
            f"{g['added_p99_ms']:+.2f} ms ({', '.join(f'{d:+.2f}' for d in g['added_p99_ms_all'])})",
            f"<= {targets['reload_added_p99_ms_max']} ms",
        ),
        (
            "non-2xx / socket errors; upstream requests during the runs",
            f"{g['quiet']['non_2xx'] + g['reloading']['non_2xx']} /"
            f" {g['quiet']['socket_errors'] + g['reloading']['socket_errors']};"
            f" {json.dumps(ups) if ups else 0}",
            f"0 / 0; no `tools/list` (only `{TOGGLED}`'s probes and listen streams)",
        ),
    ]
    return title, header, [f"| {m} | {f} | {t} |" for m, f, t in rows]


def verdicts(result: dict[str, Any], targets: dict[str, Any]) -> dict[str, bool]:
    g = result.get("reload")
    if not g or "quiet" not in g:
        return {}
    ups = g["upstream_requests_during"]
    return {
        "added_p99_ok": g["added_p99_ms"] <= targets["reload_added_p99_ms_max"],
        "reloads_ok": g["reloads"] > 0 and g["reloads_ok"] == g["reloads"] == len(g["applied_ms_all"]),
        "no_errors_ok": all(g[s]["non_2xx"] == 0 and g[s]["socket_errors"] == 0 for s in SIDES),
        "hits_only_ok": ups.get("tools/list", 0) == 0,
    }
