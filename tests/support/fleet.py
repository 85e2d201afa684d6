"""Start the real upstream MCP servers in ``tests/servers/`` and talk to their test endpoints.

    with run_server("public_upstream") as up:            # or: async with run_server(...) as up:
        up.url       # "http://127.0.0.1:PORT/mcp"
        up.base_url  # "http://127.0.0.1:PORT"
        url, base_url = up                               # unpacks to (url, base_url)
    counts = await fetch_counts(up.base_url)             # {"tools/list": 1, ...}

Each server is ``python tests/servers/<script>.py PORT`` (this interpreter unless ``python=`` says
otherwise; :class:`run_legacy_server` runs ``legacy_upstream.py`` on the older SDK) bound to
127.0.0.1; it is terminated (then killed if needed) and reaped on exit. Its stdout+stderr go to a
temporary log file, included in the error if it does not start.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVERS_DIR = REPO_ROOT / "tests" / "servers"
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0
#: The Python of ``.tools/legacy-venv`` (made by ``scripts/install-tools.sh``), which runs
#: ``tests/servers/legacy_upstream.py`` on the older SDK.
LEGACY_PYTHON = REPO_ROOT / ".tools" / "legacy-venv" / "bin" / "python"


#: Plain HTTP to 127.0.0.1, never through an http_proxy from the environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def healthy(port: int) -> bool:
    """``GET /healthz`` on a new connection to 127.0.0.1:``port`` answers 200."""
    try:
        with DIRECT.open(f"http://{HOST}:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


@dataclass(frozen=True)
class Upstream:
    """A running upstream server. Iterating yields ``(url, base_url)``."""

    url: str
    base_url: str
    port: int
    process: subprocess.Popen[bytes] = field(repr=False)
    log_path: Path

    def __iter__(self) -> Iterator[str]:
        return iter((self.url, self.base_url))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class run_server:  # used like a function: `with run_server("x") as up`
    """Context manager (sync and async) running ``tests/servers/<script>.py PORT``.

    ``env`` entries are added to (and override) the current environment, e.g.
    ``env={"UPSTREAM_TTL_MS": "500"}``.  ``port`` defaults to :func:`free_port`. ``python`` is
    the interpreter that runs the script (another virtual environment's, for an older SDK).
    """

    def __init__(
        self,
        script: str,
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        python: str | Path = sys.executable,
    ) -> None:
        name = script.removesuffix(".py")
        self.script_path = SERVERS_DIR / f"{name}.py"
        if not self.script_path.is_file():
            raise FileNotFoundError(self.script_path)
        self.env = dict(env or {})
        if port is not None and not _port_is_free(port):
            raise RuntimeError(f"port {HOST}:{port} is already in use")
        self.port = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self.python = str(python)
        self.upstream: Upstream | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def _start(self) -> Upstream:
        fd, log_name = tempfile.mkstemp(prefix=f"{self.script_path.stem}-{self.port}-", suffix=".log")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                [self.python, str(self.script_path), str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
            )
        base = f"http://{HOST}:{self.port}"
        self.upstream = Upstream(f"{base}/mcp", base, self.port, proc, Path(log_name))
        return self.upstream

    def _check(self, up: Upstream, deadline: float) -> bool:
        """True once the port accepts connections; raises if the process died or time ran out."""
        if up.process.poll() is not None:
            self._stop()
            raise RuntimeError(f"{self.script_path.name} exited with {up.process.returncode}:\n{up.log()}")
        try:
            with socket.create_connection((HOST, up.port), timeout=0.2):
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            self._stop()
            what = f"{self.script_path.name} did not listen on {HOST}:{up.port} within {self.startup_timeout}s"
            raise RuntimeError(f"{what}:\n{up.log()}")
        return False

    def _stop(self) -> None:
        up = self.upstream
        if up is None or up.process.returncode is not None:
            return
        up.process.terminate()
        try:
            up.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            up.process.kill()
            up.process.wait()

    def __enter__(self) -> Upstream:
        up = self._start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._check(up, deadline):
            time.sleep(0.05)
        return up

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    async def __aenter__(self) -> Upstream:
        up = self._start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._check(up, deadline):  # noqa: ASYNC110 - polling a child process port
            await asyncio.sleep(0.05)
        return up

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self._stop)


class run_legacy_server(run_server):
    """``run_server("legacy_upstream")`` under :data:`LEGACY_PYTHON` (the older SDK, mcp 1.30.0).

    ``port`` may be one a stopped server just used (uvicorn binds with SO_REUSEADDR), which
    ``run_server`` itself would refuse as taken.
    """

    def __init__(self, *, port: int | None = None) -> None:
        super().__init__("legacy_upstream", python=LEGACY_PYTHON)
        if port is not None:
            self.port = port


# -- test endpoints of the servers (see tests/servers/_common.py) ------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request as received by an upstream's /mcp endpoint."""

    method: str  # JSON-RPC method ("<GET>"/"<DELETE>" for non-POST, "<response>", "<invalid>")
    http_method: str
    body: bytes  # the exact bytes received
    headers: list[tuple[str, str]]  # as received; names lower-cased
    status: int | None  # the upstream's HTTP status (None if it never answered)
    content_type: str | None  # the upstream's response Content-Type

    def header(self, name: str) -> str | None:
        """Last value of header ``name`` (case-insensitive), or None."""
        values = [v for k, v in self.headers if k == name.lower()]
        return values[-1] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


def _base(base_url: str | Upstream) -> str:
    return (base_url.base_url if isinstance(base_url, Upstream) else base_url).rstrip("/")


async def _call(http_method: str, url: str, payload: Any = None) -> Any:
    async with aiohttp.ClientSession() as session:
        async with session.request(http_method, url, json=payload) as resp:
            resp.raise_for_status()
            return await resp.json()


async def fetch_counts(base_url: str | Upstream) -> dict[str, int]:
    """``{json-rpc method: number of HTTP requests received}`` since start or last reset."""
    return dict(await _call("GET", f"{_base(base_url)}/_counts"))


async def reset_counts(base_url: str | Upstream) -> None:
    """Clear the counts and the recorded requests."""
    await _call("POST", f"{_base(base_url)}/_counts/reset")


async def fetch_requests(base_url: str | Upstream) -> list[RecordedRequest]:
    """Every request received on /mcp since start or last reset, oldest first."""
    return [
        RecordedRequest(
            method=r["method"],
            http_method=r["http_method"],
            body=base64.b64decode(r["body_b64"]),
            headers=[(k, v) for k, v in r["headers"]],
            status=r["status"],
            content_type=r["response_content_type"],
        )
        for r in await _call("GET", f"{_base(base_url)}/_requests")
    ]


async def add_tool(base_url: str | Upstream, name: str | None = None) -> dict[str, Any]:
    """changing_upstream only: add a tool and publish tools/list_changed. Returns {"added", "tools"}."""
    return dict(await _call("POST", f"{_base(base_url)}/_add_tool", {"name": name} if name else {}))


async def bump_resource(base_url: str | Upstream) -> dict[str, Any]:
    """changing_upstream only: change res://counter and publish resources/updated for it."""
    return dict(await _call("POST", f"{_base(base_url)}/_bump_resource"))


async def legacy_requests(up: Upstream) -> list[dict[str, Any]]:
    """What legacy_upstream.py recorded (see its docstring)."""
    async with aiohttp.ClientSession() as session, session.get(f"{up.base_url}/_requests") as resp:
        resp.raise_for_status()
        return list(await resp.json())
