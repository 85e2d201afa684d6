"""Profile the gateway's cached path: py-spy samples one gateway worker while wrk drives hits.

Usage: python bench/profile_gateway.py [--method tools/list] [--seconds 10] [--connections 32]
                               [--log-level info] [--native]

Starts the SDK upstream and a one-worker gateway on 127.0.0.1, warms the cache, then runs
``py-spy record`` on the gateway during a wrk run. Writes bench-results/profile-<method>.txt
(collapsed stacks, for speedscope or flamegraph.pl) and prints the functions with the most
samples, by own time and by inclusive time. Needs py-spy (``bash scripts/install-bench-tools.sh``)
and permission to ptrace the gateway (root, or CAP_SYS_PTRACE in a container).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench


def summarise(collapsed: Path, top: int) -> str:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
            for f in stack.split(";")
        ]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples", "", "own time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines += ["", "inclusive time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="tools/list", choices=("tools/list", "server/discover", "tools/call"))
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--log-level", default="info")
    p.add_argument("--native", action="store_true", help="include native (C) frames")
    p.add_argument("--top", type=int, default=30)
    opts = p.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists() or shutil.which("wrk") is None:
        print("profile: needs py-spy and wrk: bash scripts/install-bench-tools.sh", file=sys.stderr)
        return 2
    out_dir = bench.ROOT / "bench-results"
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    collapsed = out_dir / f"profile-{opts.method.replace('/', '_')}.txt"
    with bench.fleet_context(logs) as fleet:
        up_port, gw_port = bench.free_port(), bench.free_port()
        up = fleet.start("upstream", [bench.PY, str(bench.BENCH / "upstream_25_tools.py"), str(up_port)])
        bench.wait_ready(fleet, "upstream", up, lambda: bench.fetch(up_port, "GET", "/_counts")[0] == 200)
        config = logs / "profile-gateway.toml"
        bench.write_gateway_config(config, gw_port, up_port, caching=True)
        gw = fleet.start("profile-gateway", bench.gateway_argv(config, 1, opts.log_level))
        bench.wait_ready(fleet, "profile-gateway", gw, lambda: bench.fetch(gw_port, "GET", "/readyz")[0] == 200)
        extra = {"name": bench.CALL_NAME, "args": bench.CALL_ARGS} if opts.method == "tools/call" else {}
        call_params = {"name": bench.CALL_NAME, "arguments": bench.CALL_ARGS} if extra else {}
        for i in range(5):
            bench.mcp_call(gw_port, "/servers/workspace/mcp", opts.method, i, **call_params)
        argv = [py_spy, "record", "--pid", str(gw.pid), "--rate", "250", "--format", "raw", "-o", str(collapsed)]
        argv += ["--duration", str(int(opts.seconds))]
        if opts.native:
            argv.append("--native")
        spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        fleet.procs.append(("py-spy", spy))
        time.sleep(0.5)
        run = bench.wrk(
            fleet,
            f"http://{bench.HOST}:{gw_port}/servers/workspace/mcp",
            opts.method,
            connections=opts.connections,
            duration=opts.seconds,
            name=extra.get("name"),
            args=extra.get("args"),
        )
        _, err = spy.communicate(timeout=opts.seconds + 30)
        if spy.returncode != 0:
            print(err.decode(), file=sys.stderr)
            return 1
    print(f"{opts.method}: {run['rps']:.0f} req/s under py-spy, p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms")
    print(summarise(collapsed, opts.top))
    print(f"collapsed stacks: {collapsed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
