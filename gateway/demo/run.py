"""``mcp-gateway demo`` itself: the demo servers as child processes, the gateway in-process in
front of them, a banner of commands to try, and an orderly stop on Ctrl-C or SIGTERM.

Each child lives in its own session (a terminal Ctrl-C reaches only the demo, which then stops
them in order) and exits on its own when its stdin pipe closes, so even a killed demo leaves no
orphans.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from ..httpserver import install_json_errors
from ..telemetry import quiet_server_errors
from .servers import HOST, MCP_PATH

__all__ = ["DemoError", "run_demo"]

PROTOCOL_VERSION: Final = "2026-07-28"
STARTUP_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 5.0
#: What each demo upstream shows, for the banner.
UPSTREAMS: Final = {
    "weather": "public cache hints (ttl 60 s): shared by every caller",
    "notes": "private cache hints (per-user data): never stored by the gateway",
}


class DemoError(Exception):
    """The demo cannot start or a child died; the message says why.

    ``keep_logs``: the children's logs explain it, so they are not deleted.
    """

    def __init__(self, message: str, *, keep_logs: bool = False) -> None:
        super().__init__(message)
        self.keep_logs = keep_logs


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


#: Set (to 1) by ``make demo``: the hints then say ``make demo PORT=...``, what the user typed.
VIA_MAKE_ENV: Final = "MCP_GATEWAY_VIA_MAKE"


def _port_option(port: int) -> str:
    """How the user asks for gateway port ``port``: ``make demo PORT=N`` when the demo was started
    by ``make demo``, else ``mcp-gateway demo --port N``."""
    return f"make demo PORT={port}" if os.environ.get(VIA_MAKE_ENV) else f"mcp-gateway demo --port {port}"


def _check_port_free(port: int) -> None:
    """Raise :class:`DemoError` if 127.0.0.1:``port`` cannot be bound (same options as aiohttp)."""
    if not 0 <= port <= 65535:
        given = f"PORT={port}" if os.environ.get(VIA_MAKE_ENV) else f"--port {port}"
        raise DemoError(f"{given} is not a TCP port (0-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if os.name == "posix":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as exc:
            raise DemoError(_port_taken(port, exc)) from exc


def _port_taken(port: int, exc: OSError) -> str:
    other = 18080 if port != 18080 else 18081
    return (
        f"cannot listen on {HOST}:{port} for the gateway ({exc.strerror or exc}); "
        f"is something else using it? Pick another port: {_port_option(other)}"
    )


@dataclass
class _Child:
    """One running demo upstream."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}{MCP_PATH}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        tail = text.splitlines()[-lines:]
        return "\n".join(f"    | {line}" for line in tail) if tail else "    | (empty log)"


class _Fleet:
    """The demo's child processes: spawn, wait until they listen, stop (idempotent)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[_Child] = []

    def spawn(self, name: str) -> _Child:
        port = _free_port()
        log_path = self.log_dir / f"{name}.log"
        package_root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        argv = [sys.executable, "-m", "gateway.demo", "serve-upstream", name, str(port), "--exit-on-stdin-eof"]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,  # never written: its EOF tells the child the demo is gone
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C goes to the demo only; it stops the children
            )
        child = _Child(name, port, process, log_path)
        self.children.append(child)
        return child

    def _died(self, child: _Child, when: str) -> DemoError:
        return DemoError(
            f"upstream {child.name!r} (pid {child.process.pid}) exited with code {child.process.returncode} "
            f"{when}; the end of its log ({child.log_path}):\n{child.log_tail()}",
            keep_logs=True,
        )

    async def wait_ready(self, limit_s: float) -> None:
        """Return once every child accepts TCP connections; raise if one dies or is too slow."""
        deadline = time.monotonic() + limit_s
        pending = list(self.children)
        while pending:
            for child in list(pending):
                if child.process.poll() is not None:
                    raise self._died(child, "during startup")
                if await _accepts(child.port):
                    pending.remove(child)
            if not pending:
                return
            if time.monotonic() > deadline:
                child = pending[0]
                raise DemoError(
                    f"upstream {child.name!r} did not listen on {HOST}:{child.port} within {limit_s:g} s; "
                    f"the end of its log ({child.log_path}):\n{child.log_tail()}",
                    keep_logs=True,
                )
            await asyncio.sleep(0.1)

    def check_alive(self) -> None:
        """Raise if a child exited while the demo runs."""
        for child in self.children:
            if child.process.poll() is not None:
                raise self._died(child, "while the demo was running")

    def stop(self) -> None:
        """Terminate every child still running, wait for it (kill after a grace period)."""
        for child in self.children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in self.children:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            if child.process.stdin is not None:
                with contextlib.suppress(OSError):
                    child.process.stdin.close()


def _finish_logs(log_dir: Path, *, keep: bool) -> None:
    """Delete the children's logs, or (when they explain a failure) keep them and say where."""
    if keep and any(log_dir.iterdir()):
        print(f"The upstreams' logs are kept in {log_dir}", file=sys.stderr, flush=True)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 0.5)
    except (TimeoutError, OSError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class _AccessLine(logging.Formatter):
    """One short line per MCP request through the gateway, with its Cache-Status."""

    def format(self, record: logging.LogRecord) -> str:
        f = record.__dict__
        return (
            f"[gateway] {f.get('http_method')} {f.get('upstream')} {f.get('method')} -> {f.get('status')}"
            f"  Cache-Status: {f.get('cache_status')}  ({f.get('duration_ms')} ms)"
        )


_META: Final = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _curl(url: str, method: str, params: dict[str, Any] | None = None, *, name: str | None = None) -> str:
    """A bash-ready ``curl -si`` for one modern MCP request, with every required header."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**(params or {}), "_meta": _META}}
    headers = [
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        f"MCP-Protocol-Version: {PROTOCOL_VERSION}",
        f"Mcp-Method: {method}",
    ]
    if name is not None:
        headers.append(f"Mcp-Name: {name}")
    parts = [f"curl -si {url}", *(f"-H {shlex.quote(h)}" for h in headers)]
    parts.append(f"-d {shlex.quote(json.dumps(body, separators=(',', ':')))}")
    return " \\\n  ".join(parts)


def _banner(port: int, children: Sequence[_Child], log_dir: Path) -> str:
    base = f"http://{HOST}:{port}"
    weather, notes = f"{base}/servers/weather/mcp", f"{base}/servers/notes/mcp"
    grep = " | grep -i '^cache-status'"
    lines = [
        "",
        "mcp-gateway demo is running.  Ctrl-C stops everything.",
        "",
        f"  gateway  {base}  (metrics: {base}/metrics)",
    ]
    for c in children:
        lines.append(f"  {c.name:<8} {c.url}  pid {c.process.pid}  {UPSTREAMS[c.name]}")
        lines.append(f"  {'':<8} via the gateway: {base}/servers/{c.name}/mcp")
    lines += [
        f"  fleet    {base}/mcp  every upstream as one MCP server (tools named weather__get_forecast, ...)",
        f"  logs     {log_dir}",
        "",
        "Try these in another terminal (each request is also logged here with its Cache-Status).",
        "",
        "# 1. server/discover through the gateway: the full answer, headers first.",
        "#    First time: 'Cache-Status: mcp-gateway; fwd=miss; fwd-status=200; stored; ttl=60'",
        "#    Again within 60 s: 'Cache-Status: mcp-gateway; hit; ttl=<seconds left>'",
        _curl(weather, "server/discover"),
        "",
        "# 2. tools/list on weather (public): run it twice.",
        "#    1st: 'Cache-Status: mcp-gateway; fwd=miss; fwd-status=200; stored; ttl=60'",
        "#    2nd: 'Cache-Status: mcp-gateway; hit; ttl=59' (seconds left; the upstream is not asked)",
        _curl(weather, "tools/list") + grep,
        "",
        "# 3. The same on notes (private, per-user data): never stored, every time",
        "#    'Cache-Status: mcp-gateway; fwd=miss; fwd-status=200; detail=private'",
        _curl(notes, "tools/list") + grep,
        "",
        "# 4. A tool call (Mcp-Name carries the tool name); tool calls are never cached:",
        "#    'Cache-Status: mcp-gateway; fwd=bypass; fwd-status=200; detail=uncacheable'",
        _curl(weather, "tools/call", {"name": "get_forecast", "arguments": {"city": "Lisbon"}}, name="get_forecast"),
        "",
        "# 5. Both upstreams as one server, POST /mcp: tools named <upstream>__<tool>, composed from the",
        "#    same cache entries as above. notes' part is private, so the whole answer is private and never",
        "#    stored: 'Cache-Status: mcp-gateway; fwd=miss; detail=composed' (weather's part from the cache)",
        _curl(f"{base}/mcp", "tools/list"),
        "",
        "# 6. The cache counters (hits, misses, stores by outcome):",
        f"curl -s {base}/metrics | grep mcp_gateway_cache",
        "",
    ]
    return "\n".join(lines)


@dataclass
class _Gateway:
    """The in-process gateway: its runner once set up, its port once listening."""

    runner: web.AppRunner | None = None
    port: int | None = None


async def _serve(gateway_port: int, fleet: _Fleet, gateway: _Gateway) -> int:
    """Start the upstreams and the gateway, print the banner, run until a child dies."""
    from ..app import create_app
    from ..config import ConfigError, parse_config

    _check_port_free(gateway_port)
    for name in UPSTREAMS:
        fleet.spawn(name)
    print(f"Starting {', '.join(UPSTREAMS)} (official MCP SDK) ...", flush=True)
    await fleet.wait_ready(STARTUP_TIMEOUT_S)

    try:
        config = parse_config(
            {
                "listener": {"host": HOST, "port": gateway_port},
                "upstreams": {c.name: {"url": c.url} for c in fleet.children},
                "aggregate": {},  # POST /mcp: every upstream as one MCP server
            },
            env={},
        )
    except ConfigError as exc:  # pragma: no cover - the config above is fixed
        raise DemoError(f"internal error: demo config rejected: {exc}") from exc
    gateway.runner = web.AppRunner(create_app(config), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await gateway.runner.setup()
    try:
        await web.TCPSite(gateway.runner, HOST, gateway_port).start()
    except OSError as exc:
        raise DemoError(_port_taken(gateway_port, exc)) from exc
    gateway.port = int(gateway.runner.addresses[0][1])
    print(_banner(gateway.port, fleet.children, fleet.log_dir), flush=True)
    while True:
        fleet.check_alive()
        await asyncio.sleep(0.5)


async def _main(gateway_port: int) -> int:
    """Run the demo until a signal; clean up whatever was started, whatever happened."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    got_signal: list[str] = []
    cleaning = False

    def on_signal(sig: signal.Signals) -> None:
        if not got_signal and not cleaning:  # later ones: cleanup is under way (and bounded)
            got_signal.append(sig.name)
            task.cancel()

    signals = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    for sig in signals:
        with contextlib.suppress(NotImplementedError):  # no loop signal handlers on Windows
            loop.add_signal_handler(sig, on_signal, sig)

    log_dir = Path(tempfile.mkdtemp(prefix="mcp-gateway-demo-"))
    fleet = _Fleet(log_dir)
    gateway = _Gateway()
    access = logging.getLogger("mcp_gateway.access")
    saved = access.level, access.propagate
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_AccessLine())
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False
    quiet_server_errors()
    install_json_errors()  # as serve does: unparseable requests get JSON-RPC errors quoting nothing
    code, keep_logs = 1, False
    try:
        code = await _serve(gateway_port, fleet, gateway)
    except asyncio.CancelledError:
        if not got_signal:
            raise
        task.uncancel()
        print(f"\n{got_signal[0]}: stopping the gateway and the upstreams ...", flush=True)
        code = 0
    except DemoError as exc:
        print(f"mcp-gateway demo: {exc}", file=sys.stderr, flush=True)
        keep_logs = exc.keep_logs
    finally:
        cleaning = True
        try:
            if gateway.runner is not None:
                await gateway.runner.cleanup()
        finally:
            fleet.stop()
            access.removeHandler(handler)
            access.setLevel(saved[0])
            access.propagate = saved[1]
            for sig in signals:
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(sig)
        stopped = [f"the gateway on port {gateway.port}"] if gateway.port is not None else []
        stopped += [f"{c.name} (pid {c.process.pid})" for c in fleet.children]
        if stopped:
            print(f"Stopped {', '.join(stopped)}.", flush=True)
        _finish_logs(log_dir, keep=keep_logs)
    return code


def run_demo(gateway_port: int = 8080) -> int:
    """Start the demo fleet behind a gateway on 127.0.0.1:``gateway_port``; block until
    Ctrl-C or SIGTERM, then stop everything. Returns the process exit code (0 when stopped
    by a signal, 1 when something could not start or died)."""
    if importlib.util.find_spec("mcp") is None:
        print(
            "mcp-gateway demo: the demo servers need the official MCP SDK: pip install 'mcp-gateway[demo]'",
            file=sys.stderr,
        )
        return 1
    try:
        return asyncio.run(_main(gateway_port))
    except KeyboardInterrupt:  # platforms without loop signal handlers; cleanup already ran
        return 0
