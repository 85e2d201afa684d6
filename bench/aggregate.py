"""``make bench``'s aggregate part: ``POST /mcp`` against the per-upstream route.

One 1-worker gateway with two upstreams, ``a`` and ``b``, both on bench/run.py's 25-tool SDK
upstream, and ``[aggregate] upstreams = ["a", "b"]``: its ``/mcp`` lists their 50 tools as
``a__<name>`` and ``b__<name>``. On that one process, measured side by side:

  lists   a warm ``tools/list`` on ``/mcp`` (composed from the two members' cache entries, itself
          stored) and a warm ``tools/list`` on ``/servers/a/mcp``: wrk (bench/mcp.lua) at
          ``--connections``, ``--rounds`` rounds of ``--duration`` s, the order rotated every
          round (as bench/run.py's cached runs); the ratio is the median over rounds of
          (aggregate req/s / per-upstream req/s). Both answers are checked to be hits first,
          and the upstream's own counts (bench/upstream_25_tools.py) must not move during the runs.
          With 1 worker and 2+ CPUs the gateway runs on the first CPU and wrk on the others.
  calls   ``tools/call`` of ``a__get_issue`` on ``/mcp`` and of ``get_issue`` on
          ``/servers/a/mcp`` (mcp.lua sends the name in ``params.name`` and ``Mcp-Name``) at 1
          connection, ``--fwd-rounds`` alternating rounds of ``--fwd-duration`` s, not pinned (the
          upstream answers them); the added p50 and p99 are medians over rounds of (aggregate -
          per-upstream).
"""

from __future__ import annotations

import json
import os
import statistics
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
    median_run,
    run_summary,
    set_group_affinity,
    upstream_counts,
    wait_ready,
    wrk,
)

MEMBERS = ("a", "b")
SEPARATOR = "__"
AGG_PATH = "/mcp"
MEMBER_PATH = f"/servers/{MEMBERS[0]}/mcp"
#: The two sides of every comparison, in their first round's order (the reference first).
SIDES = ("per_upstream", "aggregate")
PATHS = {"per_upstream": MEMBER_PATH, "aggregate": AGG_PATH}


def write_config(path: Path, port: int, upstream_port: int) -> None:
    members = "".join(f'[upstreams.{m}]\nurl = "http://{HOST}:{upstream_port}/mcp"\n\n' for m in MEMBERS)
    path.write_text(
        f'[listener]\nhost = "{HOST}"\nport = {port}\n\n{members}'
        f"[aggregate]\nupstreams = {json.dumps(list(MEMBERS))}\nseparator = {json.dumps(SEPARATOR)}\n"
    )


def message(body: bytes) -> dict[str, Any]:
    """The JSON-RPC message of an answer, JSON or SSE (its last ``data:`` line)."""
    text = body.decode(errors="replace").strip()
    if not text.startswith("{"):
        lines = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        text = lines[-1] if lines else "{}"
    try:
        msg = json.loads(text)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}


def check_list(port: int, path: str, tools: int, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """One warm ``tools/list`` on ``path``: a hit with the caller's id, a ``ttlMs``, ``tools``
    tools, each name starting with one of ``prefixes``, no ``nextCursor``."""
    status, headers, body = mcp_call(port, path, "tools/list", "check-hit")
    msg = message(body)
    result = msg.get("result") or {}
    names = [t.get("name", "") for t in result.get("tools", [])]
    cache_status = headers.get("cache-status", "")
    ok = {
        "status_200": status == 200,
        "hit": cache_status.startswith("mcp-gateway; hit"),
        "id": msg.get("id") == "check-hit",
        "ttl_ms": isinstance(result.get("ttlMs"), int),
        "tools": len(names) == tools,
        "names": all(n.startswith(prefixes) for n in names),
        "one_page": "nextCursor" not in result,
    }
    return {
        "ok": all(ok.values()),
        "failed": [k for k, v in ok.items() if not v],
        "status": status,
        "cache_status": cache_status,
        "tools": len(names),
        "response_bytes": len(body),
    }


def check_call(port: int, path: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    status, headers, body = mcp_call(port, path, "tools/call", "check-call", name=name, arguments=args)
    msg = message(body)
    ok = status == 200 and msg.get("id") == "check-call" and "result" in msg and not msg["result"].get("isError")
    return {
        "ok": ok,
        "status": status,
        "content_type": headers.get("content-type", ""),
        "cache_status": headers.get("cache-status", ""),
        "result": msg.get("result"),
        "response": None if ok else body[:300].decode(errors="replace"),
    }


def cpu_plan(opts: Any) -> tuple[set[int] | None, set[int] | None]:
    """(the gateway's CPUs, wrk's CPUs) for the list runs: as bench/run.py's cpu_plan for 1 worker."""
    cpus = sorted(os.sched_getaffinity(0))
    if not opts.pin or len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def list_runs(fleet: Fleet, proc: Any, port: int, up_port: int, opts: Any) -> dict[str, Any]:
    server_cpus, wrk_cpus = cpu_plan(opts)
    every_cpu = os.sched_getaffinity(0)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    order = list(SIDES)
    if server_cpus:
        set_group_affinity(proc.pid, server_cpus)
    before = upstream_counts(up_port)
    try:
        for r in range(opts.rounds):
            k = r % len(order)  # each side first in turn
            for side in order[k:] + order[:k]:
                log(f"aggregate: warm tools/list, {side} (round {r + 1}/{opts.rounds})")
                runs[side].append(
                    wrk(
                        fleet,
                        f"http://{HOST}:{port}{PATHS[side]}",
                        "tools/list",
                        connections=opts.connections,
                        duration=opts.duration,
                        server=proc,
                        cpus=wrk_cpus,
                    )
                )
    finally:
        if server_cpus:
            set_group_affinity(proc.pid, every_cpu)
    during = upstream_counts(up_port) - before
    agg, per = runs["aggregate"], runs["per_upstream"]
    ratios = [a["rps"] / p["rps"] for a, p in zip(agg, per, strict=True)]
    cpu_ratios = [
        p["cpu_us_per_request"] / a["cpu_us_per_request"]
        for a, p in zip(agg, per, strict=True)
        if a["cpu_us_per_request"] and p["cpu_us_per_request"]
    ]
    return {
        "connections": opts.connections,
        "rounds": opts.rounds,
        "duration_s": opts.duration,
        "cpus": {"gateway": sorted(server_cpus), "wrk": sorted(wrk_cpus or ())} if server_cpus else None,
        "aggregate": median_run(agg),
        "per_upstream": median_run(per),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_all": [round(x, 3) for x in ratios],
        # per-upstream CPU per request / aggregate CPU per request: the same ratio, less
        # sensitive to other load on the machine.
        "cpu_ratio": round(statistics.median(cpu_ratios), 3) if cpu_ratios else None,
        "upstream_requests_during": dict(during),
    }


def call_runs(fleet: Fleet, port: int, call: tuple[str, dict[str, Any]], opts: Any) -> dict[str, Any]:
    name, args = call
    names = {"per_upstream": name, "aggregate": f"{MEMBERS[0]}{SEPARATOR}{name}"}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for i in range(opts.fwd_rounds):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:  # the order flips every round
            log(f"aggregate: tools/call {names[side]}, {side}, 1 connection (round {i + 1}/{opts.fwd_rounds})")
            runs[side].append(
                wrk(
                    fleet,
                    f"http://{HOST}:{port}{PATHS[side]}",
                    "tools/call",
                    connections=1,
                    duration=opts.fwd_duration,
                    name=names[side],
                    args=args,
                )
            )
    pairs = list(zip(runs["aggregate"], runs["per_upstream"], strict=True))
    out: dict[str, Any] = {"rounds": opts.fwd_rounds, "duration_s": opts.fwd_duration, "names": names}
    for side in SIDES:
        row = median_run(runs[side])
        row["p50_ms"] = statistics.median(r["p50_ms"] for r in runs[side])
        row["p99_ms"] = statistics.median(r["p99_ms"] for r in runs[side])
        row["p50_ms_all"] = [r["p50_ms"] for r in runs[side]]
        row["p99_ms_all"] = [r["p99_ms"] for r in runs[side]]
        out[side] = row
    out["added_p50_ms"] = round(statistics.median(a["p50_ms"] - p["p50_ms"] for a, p in pairs), 3)
    out["added_p99_ms"] = round(statistics.median(a["p99_ms"] - p["p99_ms"] for a, p in pairs), 3)
    out["added_p50_ms_all"] = [round(a["p50_ms"] - p["p50_ms"], 3) for a, p in pairs]
    return out


def run(fleet: Fleet, workdir: Path, up_port: int, opts: Any, call: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Lists, then calls, on one fresh 1-worker gateway with members ``a`` and ``b`` on ``up_port``;
    ``call`` is the (name, arguments) of the member's tool to call."""
    port = free_port()
    config = workdir / "gateway-aggregate.toml"
    write_config(config, port, up_port)
    name = "gateway-aggregate"
    proc = fleet.start(name, gateway_argv(config, 1, opts.log_level, opts.loop))
    out: dict[str, Any] = {"workers": 1, "members": list(MEMBERS), "separator": SEPARATOR}
    try:
        wait_ready(fleet, name, proc, lambda: fetch(port, "GET", "/readyz")[0] == 200)
        upstream_tools = len(message(mcp_call(up_port, "/mcp", "tools/list", 1)[2])["result"]["tools"])
        prefixes = tuple(f"{m}{SEPARATOR}" for m in MEMBERS)
        log("aggregate: warming /mcp and /servers/a/mcp tools/list")
        for i in range(20):
            for path in (AGG_PATH, MEMBER_PATH):
                mcp_call(port, path, "tools/list", i)
        out["checks"] = {
            "aggregate": check_list(port, AGG_PATH, upstream_tools * len(MEMBERS), prefixes),
            "per_upstream": check_list(port, MEMBER_PATH, upstream_tools, ("",)),
        }
        for side, c in out["checks"].items():
            if not c["ok"]:
                log(f"aggregate: the warm {side} tools/list is not a correct hit: {c}")
            if c["status"] != 200:
                raise RuntimeError(f"aggregate: {side} tools/list: HTTP {c['status']}: {c}")
        out["lists"] = list_runs(fleet, proc, port, up_port, opts)
        call_name, call_args = call
        out["call_checks"] = {
            "aggregate": check_call(port, AGG_PATH, f"{MEMBERS[0]}{SEPARATOR}{call_name}", call_args),
            "per_upstream": check_call(port, MEMBER_PATH, call_name, call_args),
        }
        for side, c in out["call_checks"].items():
            if not c["ok"]:
                raise RuntimeError(f"aggregate: {side} tools/call failed: {c}")
        results = [c.pop("result") for c in out["call_checks"].values()]
        out["same_call_result"] = results[0] == results[1]
        out["calls"] = call_runs(fleet, port, call, opts)
    finally:
        fleet.stop(proc)
    return out


# -- report -------------------------------------------------------------------------------------------------


def table(result: dict[str, Any], targets: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The "Aggregate" table: its title, header and rows (no rows without the aggregate part)."""
    g = result.get("aggregate")
    if not g or "lists" not in g:
        return [], [], []
    lists, checks = g["lists"], g["checks"]
    pin = f"; gateway on CPU {lists['cpus']['gateway']}, wrk on CPU {lists['cpus']['wrk']}" if lists["cpus"] else ""
    members = " and ".join(f"`{m}`" for m in g["members"])
    title = [
        f"Aggregate `POST /mcp` (1 worker; members {members}, both on the 25-tool SDK upstream; lists: wrk, 1"
        f" thread, {lists['connections']} connections, {lists['rounds']} rounds of {lists['duration_s']:g} s, the"
        f" order rotated{pin}; calls: 1 connection, alternating rounds; same gateway process for both routes)"
    ]
    header = ["| measure | figure | target |", "|---|---|---|"]
    a, p = checks["aggregate"], checks["per_upstream"]
    ups = lists["upstream_requests_during"]
    rows = [
        (
            f"warm `tools/list` on `/mcp` ({a['tools']} tools, {a['response_bytes']} B)",
            run_summary(lists["aggregate"]),
            "",
        ),
        (
            f"warm `tools/list` on `/servers/a/mcp` ({p['tools']} tools, {p['response_bytes']} B)",
            run_summary(lists["per_upstream"]),
            "",
        ),
        (
            "ratio `/mcp` / per-upstream req/s, median of rounds (range); CPU ratio",
            f"{lists['ratio']:.2f} ({min(lists['ratio_all']):.2f}-{max(lists['ratio_all']):.2f}); {lists['cpu_ratio']}",
            f">= {targets['aggregate_list_ratio_min']}",
        ),
        (
            "both warm answers hits (Cache-Status); upstream requests during the list runs",
            f"{'yes' if a['ok'] and p['ok'] else 'NO: ' + a['cache_status'] + ' / ' + p['cache_status']};"
            f" {sum(ups.values())}{' ' + json.dumps(ups) if ups else ''}",
            "yes; 0",
        ),
    ]
    c = g.get("calls")
    if c:
        ag, pu = c["aggregate"], c["per_upstream"]
        rows += [
            (
                f"`tools/call` at 1 connection, p50 / p99 ms: `/mcp` (`{c['names']['aggregate']}`) /"
                f" `/servers/a/mcp` (`{c['names']['per_upstream']}`), medians of {c['rounds']} rounds",
                f"{ag['p50_ms']:.2f} / {ag['p99_ms']:.2f}; {pu['p50_ms']:.2f} / {pu['p99_ms']:.2f}"
                f" ({ag['rps']:.0f} and {pu['rps']:.0f} req/s)",
                "",
            ),
            (
                "added by `/mcp`, p50 / p99 ms (median of the rounds' differences)",
                f"{c['added_p50_ms']:+.2f} / {c['added_p99_ms']:+.2f}"
                f"{'' if g.get('same_call_result') else '; the two results DIFFER'}",
                f"p50 <= {targets['aggregate_call_added_p50_ms_max']} ms",
            ),
        ]
    return title, header, [f"| {m} | {f} | {t} |" for m, f, t in rows]


def verdicts(result: dict[str, Any], targets: dict[str, Any]) -> dict[str, bool]:
    g = result.get("aggregate")
    if not g or "lists" not in g:
        return {}
    lists = g["lists"]
    v = {
        "list_ratio_ok": lists["ratio"] >= targets["aggregate_list_ratio_min"],
        "list_hits_ok": all(c["ok"] for c in g["checks"].values()),
        "list_no_upstream_requests_ok": sum(lists["upstream_requests_during"].values()) == 0,
        "list_no_errors_ok": all(lists[s]["non_2xx"] == 0 and lists[s]["socket_errors"] == 0 for s in SIDES),
    }
    c = g.get("calls")
    if c:
        v["call_added_p50_ok"] = c["added_p50_ms"] <= targets["aggregate_call_added_p50_ms_max"]
        v["call_same_result_ok"] = bool(g.get("same_call_result"))
        v["call_no_errors_ok"] = all(c[s]["non_2xx"] == 0 and c[s]["socket_errors"] == 0 for s in SIDES)
    return v
