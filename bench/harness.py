"""The benchmark's plumbing, shared by bench/run.py and bench/cluster.py: child processes (one
process group each, all stopped on exit), CPU pinning and CPU time, plain HTTP for setup and
checks, raw keep-alive HTTP/1.1 for timed requests, and ``wrk`` runs summarised by bench/mcp.lua.
Bound to 127.0.0.1 only; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
LUA = BENCH / "mcp.lua"
PY = sys.executable
HOST = "127.0.0.1"
#: The benchmark upstream's route on a gateway.
MCP_PATH = "/servers/workspace/mcp"
V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}


# -- child processes ----------------------------------------------------------------------


def pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that restricts the child to ``cpus`` (``None``: no restriction)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def set_group_affinity(pgid: int, cpus: set[int]) -> None:
    """Restrict every live process of process group ``pgid`` (a server and its workers) to ``cpus``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                os.sched_setaffinity(int(entry.name), cpus)
        except (OSError, ValueError):
            continue  # gone meanwhile


@dataclass
class Fleet:
    """Every child process this run started, each in its own process group."""

    logs: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own group: workers it forks are stopped with it
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait)
        # Workers of a gateway whose parent already exited: their group is still the leader's pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self.procs = [(n, p) for n, p in self.procs if p is not proc]

    def close(self) -> None:
        for _, proc in reversed(list(self.procs)):
            self.stop(proc)

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_summary(x: dict[str, Any]) -> str:
    """One wrk run as a table cell: requests/s, p50 and p99 latency (ms), CPU per request (µs)."""
    latency = f"p50 {x['p50_ms']:.2f} ms, p99 {x['p99_ms']:.2f} ms"
    return f"{x['rps']:.0f} req/s, {latency}, CPU {x['cpu_us_per_request']} µs/req"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


# -- plain HTTP (stdlib; setup and checks only) ---------------------------------------------


def mcp_body(method: str, id_: object = 1, **params: Any) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": id_, "method": method, "params": {**params, "_meta": META}},
        separators=(",", ":"),
    ).encode()


def mcp_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": V,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def fetch(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def mcp_call(port: int, path: str, method: str, id_: object = 1, **params: Any) -> tuple[int, dict[str, str], bytes]:
    name = params.get("name") if method == "tools/call" else None
    return fetch(port, "POST", path, mcp_body(method, id_, **params), mcp_headers(method, name))


def wait_ready(fleet: Fleet, name: str, proc: subprocess.Popen[bytes], probe: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{fleet.log_tail(name)}")
        try:
            if probe():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready after 60 s:\n{fleet.log_tail(name)}")


def upstream_counts(port: int) -> Counter[str]:
    return Counter(json.loads(fetch(port, "GET", "/_counts")[2]))


def metric(port: int, name: str) -> float:
    """One unlabelled sample from a gateway's /metrics (the worker the connection reached)."""
    text = fetch(port, "GET", "/metrics")[2].decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else float("nan")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds used so far by the live processes of process group ``pgid``."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # fields[2] is pgrp; utime, stime are fields 11 and 12
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# -- wrk ------------------------------------------------------------------------------------


def wrk(fleet: Fleet, url: str, method: str, **options: Any) -> dict[str, Any]:
    """One wrk run (1 thread), started and read at once (:func:`start_wrk`'s options):
    requests/s and latency percentiles in ms, and with ``server`` the CPU time its process
    group (all its workers) spent per request, in microseconds."""
    return finish_wrk(fleet, start_wrk(fleet, url, method, **options))


@dataclass
class WrkRun:
    """A wrk run under way (:func:`start_wrk`), to be read by :func:`finish_wrk`."""

    proc: subprocess.Popen[bytes]
    connections: int
    duration: float
    load_before: float
    server: subprocess.Popen[bytes] | None
    cpu_before: float


def start_wrk(
    fleet: Fleet,
    url: str,
    method: str,
    *,
    connections: int,
    duration: float,
    name: str | None = None,
    args: dict[str, Any] | None = None,
    server: subprocess.Popen[bytes] | None = None,
    cpus: set[int] | None = None,
    authorization: str | None = None,
) -> WrkRun:
    """Start one wrk run and return at once (two started one after the other load their servers
    at the same time: ``contended_runs``); ``server``: the process whose group's CPU time is
    counted; ``authorization``: the ``Authorization`` header value of every request."""
    env = {"MCP_METHOD": method}
    if authorization is not None:
        env["MCP_AUTHORIZATION"] = authorization
    if name is not None:
        env["MCP_NAME"] = name
        env["MCP_ARGS"] = json.dumps(args or {}, separators=(",", ":"))
    load_before = os.getloadavg()[0]
    cpu_before = group_cpu_seconds(server.pid) if server is not None else 0.0
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--timeout", "10s", "-s", str(LUA), url]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
        start_new_session=True,
        preexec_fn=pinned(cpus),
    )
    fleet.procs.append(("wrk", proc))
    return WrkRun(proc, connections, duration, load_before, server, cpu_before)


def finish_wrk(fleet: Fleet, run: WrkRun) -> dict[str, Any]:
    """The figures of ``run`` once it has ended (as :func:`wrk` returns them)."""
    proc, server, connections, duration = run.proc, run.server, run.connections, run.duration
    try:
        out, _ = proc.communicate(timeout=duration + 60)
    finally:
        fleet.stop(proc)
    cpu = group_cpu_seconds(server.pid) - run.cpu_before if server is not None else None
    line = next((ln for ln in out.decode().splitlines() if ln.startswith("BENCH_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no summary:\n{out.decode()}")
    raw = json.loads(line[len("BENCH_JSON ") :])
    lat = raw["latency_us"]
    errors = raw["errors"]
    return {
        "rps": round(raw["requests"] / (raw["duration_us"] / 1e6), 1),
        "p50_ms": lat["p50"] / 1000,
        "p90_ms": lat["p90"] / 1000,
        "p99_ms": lat["p99"] / 1000,
        "p999_ms": lat["p999"] / 1000,
        "max_ms": lat["max"] / 1000,
        "requests": raw["requests"],
        "non_2xx": errors["status"],
        "socket_errors": errors["connect"] + errors["read"] + errors["write"] + errors["timeout"],
        "connections": connections,
        "duration_s": duration,
        "loadavg_1m_before": round(run.load_before, 2),
        "cpu_us_per_request": round(cpu * 1e6 / raw["requests"], 1) if cpu is not None and raw["requests"] else None,
    }


# -- raw HTTP/1.1 (timed requests) ---------------------------------------------------------


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response from ``reader``: (status, lower-cased headers, body); the body by
    ``Content-Length`` or chunked, so that the connection can carry the next request."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() != "chunked":
        return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))
    chunks = []
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)
    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the empty line
        pass
    return status, headers, b"".join(chunks)


# -- the gateway and the runs ----------------------------------------------------------------


def gateway_argv(config: Path, workers: int, log_level: str, loop: str = "auto", plain: bool = False) -> list[str]:
    """``mcp-gateway serve`` for ``config``; ``plain``: without the hit path's speed-ups."""
    return [
        PY,
        "-m",
        "gateway.cli",
        "serve",
        "--config",
        str(config),
        "--workers",
        str(workers),
        "--log-level",
        log_level,
        "--log-format",
        "json",
        "--loop",
        loop,
        *(["--plain-path"] if plain else []),
    ]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median requests/s (its own latencies), plus every run's requests/s."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    mid = dict(ordered[(len(ordered) - 1) // 2])
    mid["rps_all"] = [r["rps"] for r in runs]
    mid["non_2xx"] = sum(r["non_2xx"] for r in runs)
    mid["socket_errors"] = sum(r["socket_errors"] for r in runs)
    return mid


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def fleet_context(logs: Path) -> Iterator[Fleet]:
    fleet = Fleet(logs)
    atexit.register(fleet.close)

    def on_signal(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    # Ctrl-C stops the run even where SIGINT was inherited as ignored (background jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield fleet
    finally:
        fleet.close()


# -- timed requests ----------------------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1:``port`` for timed requests."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Conn:
        self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(HOST, self.port), 10)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self.writer is not None:
            self.writer.close()

    def request(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        head = f"POST {path} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(self.request(path, body, headers))
        return await asyncio.wait_for(read_response(self.reader), 30)

    async def tools_list(self, cursor: str, id_: object = 1) -> tuple[float, str, bytes]:
        """(seconds to the whole answer, its Cache-Status, its body) of ``tools/list`` for ``cursor``;
        raises on anything but HTTP 200."""
        body, headers = mcp_body("tools/list", id_, cursor=cursor), mcp_headers("tools/list")
        started = time.perf_counter()
        status, resp_headers, resp_body = await self.post(MCP_PATH, body, headers)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"tools/list on port {self.port}: HTTP {status} {resp_body[:200]!r}")
        return elapsed, resp_headers.get("cache-status", ""), resp_body


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``values`` (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when installed: the timing client's own overhead, small."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
