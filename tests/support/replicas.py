"""N real gateway processes from one config, as the replicas of one deployment (tests/cluster/).

    replicas = Replicas(config, 3, tmp_path)   # not started yet
    await replicas.start_all()                 # each on its own free 127.0.0.1 port, /healthz 200
    replicas.url(0, "pub")                     # "http://127.0.0.1:PORT/servers/pub/mcp"
    replicas.base_url(1)                       # "http://127.0.0.1:PORT"
    replicas.sigkill(2); await replicas.start(2)   # dead at once, then up again on the same port
    await replicas.stop(1)                     # SIGTERM (the graceful shutdown), bounded
    replicas.logs()                            # every replica's log, for failure messages
    await replicas.close()                     # every one stopped (the fixture does this)

Each replica is ``python -m gateway.cli serve --config FILE --log-format text`` (this checkout's
gateway, with this interpreter) run from the repository root. Its config is ``config`` with
``listener`` set to its own port on 127.0.0.1 and, unless ``config`` has one, an ``[admin]``
table with :data:`ADMIN_TOKEN` (so tests can purge), written as TOML by :func:`dump_toml`. Its
stdout and stderr go to ``replica-I.log`` in the directory given.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .fleet import HOST, REPO_ROOT, free_port

ADMIN_TOKEN = "cluster-tests-admin-token-0123456789"
STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 15.0  # the gateway itself waits up to 10 s for requests in flight
LOG_TAIL_CHARS = 6000
ACCESS_LINES = 15
ACCESS_LOGGER = "mcp_gateway.access"  # the access log's logger (gateway.telemetry.ACCESS_LOGGER)


# -- TOML, written (tomllib only reads) -------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _string(value: str) -> str:
    # A JSON string is a TOML basic string, apart from DEL, which TOML wants escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no TOML for {value!r} here")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def dump_toml(data: Mapping[str, Any]) -> str:
    """``data`` as a TOML document: nested mappings become tables, everything else (scalars,
    lists, mappings inside lists) inline values. Checked by reading it back with ``tomllib``."""
    lines: list[str] = []

    def table(path: list[str], body: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, Mapping)}
        tables = {k: v for k, v in body.items() if isinstance(v, Mapping)}
        if path and (scalars or not tables):
            lines.append(f"[{'.'.join(_key(p) for p in path)}]")
        for k, v in scalars.items():
            lines.append(f"{_key(k)} = {_value(v)}")
        if scalars or (path and not tables):
            lines.append("")
        for k, v in tables.items():
            table([*path, k], v)

    table([], data)
    text = "\n".join(lines)
    if tomllib.loads(text) != json.loads(json.dumps(data)):
        raise AssertionError(f"dump_toml wrote something else than it was given:\n{text}")
    return text


# -- the replicas -----------------------------------------------------------------------------------


class Replica:
    """One gateway process of a :class:`Replicas` (index ``index``), on ``port`` for its whole life."""

    def __init__(self, index: int, port: int, config_path: Path, log_path: Path) -> None:
        self.index = index
        self.port = port
        self.config_path = config_path
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.signalled = False  # SIGTERM or SIGKILL sent: not running, even before it is reaped

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None and not self.signalled

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class Replicas:
    """``count`` gateway processes, each with ``config`` (see the module docstring)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        count: int,
        directory: Path,
        *,
        name: str = "replica",
        startup_timeout: float = STARTUP_TIMEOUT,
        extra_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = copy.deepcopy(dict(config))
        self.config.setdefault("admin", {"token": ADMIN_TOKEN})
        self.admin_token: str = self.config["admin"]["token"]
        auth = self.config.get("auth") or {}
        tokens = list(auth.get("metrics_tokens") or auth.get("tokens") or [])
        #: the ``Authorization`` header for ``/metrics`` and the MCP routes, when ``[auth]`` is set
        self.auth_headers = {"Authorization": f"Bearer {tokens[0]}"} if tokens else {}
        callers = list(auth.get("tokens") or [])
        self.caller_headers = {"Authorization": f"Bearer {callers[0]}"} if callers else {}
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.replicas: list[Replica] = []
        for index in range(count):
            port = free_port()
            config_path = self.directory / f"{name}-{index}.toml"
            one = copy.deepcopy(self.config)
            one["listener"] = {**one.get("listener", {}), "host": HOST, "port": port}
            config_path.write_text(dump_toml(one))
            self.replicas.append(Replica(index, port, config_path, self.directory / f"{name}-{index}.log"))

    def __len__(self) -> int:
        return len(self.replicas)

    def __getitem__(self, index: int) -> Replica:
        return self.replicas[index]

    def indices(self, *, running: bool = True) -> list[int]:
        """The replicas' indices (only those running, unless ``running=False``)."""
        return [r.index for r in self.replicas if r.running or not running]

    def base_url(self, index: int) -> str:
        return self.replicas[index].base_url

    def url(self, index: int, upstream: str) -> str:
        """The MCP endpoint of ``upstream`` behind replica ``index``."""
        return f"{self.replicas[index].base_url}/servers/{upstream}/mcp"

    # -- lifecycle --------------------------------------------------------------------------------
    async def start_all(self) -> None:
        """Start every replica not running, together, and wait until each answers ``/healthz``."""
        await asyncio.gather(*(self.start(r.index) for r in self.replicas if not r.running))

    async def start(self, index: int) -> None:
        """Start replica ``index`` (again) on its port and wait until it answers ``GET /healthz``."""
        replica = self.replicas[index]
        if replica.process is not None and replica.process.returncode is None:
            if not replica.signalled:
                raise RuntimeError(f"replica {index} is already running")
            await replica.process.wait()  # killed a moment ago: reaped before its port is reused
        replica.signalled = False
        argv = [
            sys.executable, "-m", "gateway.cli", "serve",
            "--config", str(replica.config_path), "--log-format", "text", *self.extra_args,
        ]  # fmt: skip
        replica.starts += 1
        with replica.log_path.open("ab") as log:
            log.write(f"--- start {replica.starts}: {' '.join(argv)}\n".encode())
            log.flush()
            # Its own process group: a SIGKILL reaches the workers of `--workers N` too.
            replica.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=self.env,
                start_new_session=True,
            )
        await self._wait_healthy(replica)

    async def _wait_healthy(self, replica: Replica) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                assert replica.process is not None
                if replica.process.returncode is not None:
                    raise RuntimeError(
                        f"replica {replica.index} exited with {replica.process.returncode}:\n{replica.log()}"
                    )
                try:
                    async with session.get(f"{replica.base_url}/healthz") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if loop.time() > deadline:
                    self._signal(replica, signal.SIGKILL)
                    raise RuntimeError(
                        f"replica {replica.index} did not answer /healthz on {replica.base_url} within "
                        f"{self.startup_timeout} s:\n{replica.log()}"
                    )
                await asyncio.sleep(0.05)

    def sigkill(self, index: int) -> None:
        """SIGKILL replica ``index`` (and its workers): gone at once, nothing cleaned up; reaped
        by the next :meth:`start` or :meth:`close`."""
        self._signal(self.replicas[index], signal.SIGKILL)

    async def stop(self, index: int, *, grace_s: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM (the gateway's graceful shutdown), SIGKILL after ``grace_s``; its exit status."""
        replica = self.replicas[index]
        proc = replica.process
        if proc is None:
            return None
        if proc.returncode is None:
            self._signal(replica, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                self._signal(replica, signal.SIGKILL)
        return await proc.wait()

    async def close(self) -> None:
        """Stop every replica (teardown)."""
        await asyncio.gather(*(self.stop(r.index) for r in self.replicas), return_exceptions=True)
        for replica in self.replicas:  # in case a stop itself failed
            self._signal(replica, signal.SIGKILL)
            if replica.process is not None:
                await replica.process.wait()

    @staticmethod
    def _signal(replica: Replica, sig: signal.Signals) -> None:
        """``sig`` to the replica's process; SIGKILL to its whole process group (its own session)."""
        proc = replica.process
        if proc is None or proc.returncode is not None:
            return
        replica.signalled = True
        try:
            if sig == signal.SIGKILL:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    # -- what they said ---------------------------------------------------------------------------
    def log(self, index: int) -> str:
        return self.replicas[index].log()

    def logs(self, *, tail: int = LOG_TAIL_CHARS, access_lines: int = ACCESS_LINES) -> str:
        """Every replica's log for a failure message, each under a header: the end of what is not
        the access log, then its last ``access_lines`` access-log lines (the file has them all)."""
        parts = []
        for r in self.replicas:
            lines = r.log().splitlines()
            access = [line for line in lines if f" {ACCESS_LOGGER} " in line]
            other = "\n".join(line for line in lines if f" {ACCESS_LOGGER} " not in line)
            parts.append(
                f"----- replica {r.index} ({r.base_url}, {r.log_path}) -----\n{other[-tail:]}\n"
                f"----- replica {r.index}: last {min(access_lines, len(access))} of {len(access)} "
                f"access-log lines -----\n" + "\n".join(access[-access_lines:])
            )
        return "\n".join(parts)

    # -- what they serve --------------------------------------------------------------------------
    async def get(self, index: int, path: str, *, limit_s: float = 5.0) -> tuple[int, Any]:
        """``GET path`` on replica ``index`` (with :attr:`auth_headers`): ``(status, JSON or text)``."""
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit_s)) as session,
            session.get(f"{self.base_url(index)}{path}", headers=self.auth_headers) as resp,
        ):
            body = await resp.read()
            try:
                return resp.status, json.loads(body)
            except ValueError:
                return resp.status, body.decode(errors="replace")

    async def metrics(self, index: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Replica ``index``'s ``/metrics``: ``{(sample name, sorted labels): value}``."""
        status, text = await self.get(index, "/metrics")
        if status != 200:
            tail = self.log(index)[-3000:]
            raise AssertionError(f"/metrics of replica {index}: {status} {text!r}; its log ends:\n{tail}")
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(str(text)):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    async def metric(self, index: int, name: str, **labels: str) -> float | None:
        """One sample of replica ``index`` (``name`` as exported, e.g. ``..._total``), or None."""
        return (await self.metrics(index)).get((name, tuple(sorted(labels.items()))))
