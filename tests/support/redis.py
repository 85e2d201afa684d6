"""A real ``redis-server`` for the cluster tests (tests/cluster/), on a free 127.0.0.1 port.

    server = RedisServer(tmp_path)   # started: answers PING
    server.url                       # "redis://127.0.0.1:PORT/0"
    server.stop(); server.start()    # down, then up again on the same port (empty: no persistence)
    server.kill()                    # SIGKILL
    server.pause(2.0)                # CLIENT PAUSE: every client's commands wait 2 s
    server.fill(); server.make_room()   # full (writes refused with OOM, reads served), then not
    server.scan_keys("*")            # the keys, by SCAN
    server.dump_all()                # {key: value} of every key (by type, see dump_all)
    server.write_garbage_over_every_key()
    server.close()                   # killed and reaped (the ``redis_server`` fixture does this)

``redis-server`` is found on PATH (``make test`` installs it: scripts/install-tools.sh). It runs
with persistence off (``--save '' --appendonly no``) in its own directory, bound to 127.0.0.1 only;
its log is a file in that directory, included in every error about it. The inspection methods use
a short-lived synchronous redis-py client with short timeouts: they are for a test's checks, between
its requests, not for load.
"""

from __future__ import annotations

import itertools
import shutil
import signal
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .fleet import HOST, free_port

STARTUP_TIMEOUT = 10.0
#: :meth:`RedisServer.fill`: room left before filling, the filler values' size, and how far
#: ``maxmemory`` is then put below what is used (a full server stays full whatever frees a little).
FILL_HEADROOM_BYTES = 1 << 20
FILLER_BYTES = 64 << 10
FULL_MARGIN_BYTES = 256 << 10
FILLER_PREFIX = "test-filler:"
STOP_TIMEOUT = 5.0
CLIENT_TIMEOUT = 2.0
#: Tries at binding a free port that another process took between the choice and the bind.
PORT_TRIES = 3

#: What :meth:`RedisServer.write_garbage_over_every_key` writes, in turn: not JSON, truncated
#: JSON, JSON of the wrong shapes, nothing, binary, and an almost plausible entry.
GARBAGE: tuple[bytes, ...] = (
    b"\x00\xff\xfegarbage\x80",
    b'{"jsonrpc": "2.0", "result": {"tools": [',
    b"[]",
    b"null",
    b"",
    bytes(range(256)),
    b'{"result": "not an object", "ttlMs": "soon", "storedAt": -1}',
    b"42",
)


def redis_server_binary() -> str:
    """The ``redis-server`` on PATH; raises naming the install step when there is none."""
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError(
            "redis-server is not on PATH: `make tools` installs it (scripts/install-tools.sh, "
            "Debian package redis-server)"
        )
    return path


def plain_forms(value: bytes) -> list[bytes]:
    """``value`` and, when it is zlib or gzip data, what it inflates to: the forms a test looks
    for a marker in (a gateway may compress what it stores)."""
    forms = [value]
    for wbits in (zlib.MAX_WBITS, 16 + zlib.MAX_WBITS):
        try:
            forms.append(zlib.decompress(value, wbits))
        except zlib.error:
            pass
    return forms


class RedisServer:
    """One ``redis-server`` process (see the module docstring). Started by the constructor."""

    def __init__(self, directory: Path, *, port: int | None = None, startup_timeout: float = STARTUP_TIMEOUT) -> None:
        self.binary = redis_server_binary()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / "redis-server.log"
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        chosen = port is None
        self.port = free_port() if port is None else port
        for attempt in range(PORT_TRIES):
            try:
                self.start()
                return
            except RuntimeError:
                if not chosen or attempt == PORT_TRIES - 1 or not self._port_was_taken():
                    raise
                self.port = free_port()

    # -- where ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        """The server's log so far (every start appends to it)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the server on :attr:`port` (empty: nothing persists) and wait until it answers PING."""
        if self.running:
            raise RuntimeError(f"redis-server on {HOST}:{self.port} is already running")
        argv = [
            self.binary,
            "--port", str(self.port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--enable-debug-command", "local",  # DEBUG SLEEP, for tests that want a hung server
            "--loglevel", "notice",
        ]  # fmt: skip
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory
            )
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"redis-server on {HOST}:{self.port} exited with {code}:\n{self.log()}")
            if self._pings():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"redis-server on {HOST}:{self.port} did not answer PING within {self.startup_timeout} s:\n"
                    f"{self.log()}"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`; the port is kept for :meth:`start`."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, and reap."""
        self._end(signal.SIGKILL)

    def close(self) -> None:
        """Teardown: kill whatever still runs."""
        self.kill()

    def _end(self, sig: signal.Signals) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _pings(self) -> bool:
        try:
            with self.client(timeout=0.2) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def _port_was_taken(self) -> bool:
        """Whether the last start failed on a port another process took meanwhile."""
        return "Address already in use" in self.log().rpartition("--- start")[2]

    # -- inspection -------------------------------------------------------------------------------
    def client(self, *, timeout: float = CLIENT_TIMEOUT) -> redis.Redis:
        """A new synchronous client (bytes in, bytes out); use it in a ``with`` block."""
        return redis.Redis(
            host=HOST,
            port=self.port,
            db=0,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # a check sees the server as it is, at once
        )

    def command(self, *args: Any) -> Any:
        """One raw command, e.g. ``command("CONFIG", "GET", "maxmemory")``."""
        with self.client() as client:
            return client.execute_command(*args)

    def pause(self, seconds: float, *, mode: str = "ALL") -> None:
        """``CLIENT PAUSE``: the server holds every client's commands (``mode="WRITE"``: only
        writes) for ``seconds``; returns at once."""
        with self.client() as client:
            client.execute_command("CLIENT", "PAUSE", max(1, round(seconds * 1000)), mode)

    def fill(self) -> int:
        """Full for real: ``maxmemory`` just above what is used, ``noeviction``, then filler keys
        (:data:`FILLER_PREFIX`) until Redis refuses a write with OOM; ``maxmemory`` then goes a
        little below what is used, so that nothing the server frees by itself (an expired key,
        a client buffer) lets a write through. Every write (SET, XADD, EVAL of a writing script)
        is refused, every read served. Returns the filler keys written; :meth:`make_room` undoes it."""
        blob = b"x" * FILLER_BYTES
        with self.client() as client:
            client.config_set("maxmemory-policy", "noeviction")
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", used + FILL_HEADROOM_BYTES)
            for n in itertools.count():
                try:
                    client.set(f"{FILLER_PREFIX}{n}", blob)
                except redis.exceptions.OutOfMemoryError:
                    used = int(client.info("memory")["used_memory"])
                    client.config_set("maxmemory", max(1, used - FULL_MARGIN_BYTES))
                    return n
                if n * FILLER_BYTES > 4 * FILL_HEADROOM_BYTES:
                    raise RuntimeError(f"redis-server on {HOST}:{self.port} took {n} filler keys without refusing one")
        raise AssertionError("unreachable")

    def make_room(self) -> None:
        """Undo :meth:`fill`: no ``maxmemory`` (the default), the filler keys deleted."""
        with self.client() as client:
            client.config_set("maxmemory", 0)
            fillers = list(client.scan_iter(match=f"{FILLER_PREFIX}*", count=1000))
            if fillers:
                client.delete(*fillers)

    def unpause(self) -> None:
        with self.client() as client:
            client.execute_command("CLIENT", "UNPAUSE")

    def scan_keys(self, pattern: str = "*") -> list[bytes]:
        """Every key matching ``pattern`` (SCAN, so the server is never blocked), sorted."""
        with self.client() as client:
            return sorted(set(client.scan_iter(match=pattern, count=1000)))

    def channels(self, pattern: str = "*") -> list[bytes]:
        """The pub/sub channels with at least one subscriber (``PUBSUB CHANNELS``), sorted."""
        with self.client() as client:
            return sorted(client.pubsub_channels(pattern))

    def dump_all(self, pattern: str = "*") -> dict[bytes, Any]:
        """``{key: value}`` for every key: a string as bytes, a hash as ``{field: value}``, a
        list as a list, a set as a sorted list, a sorted set as ``[(member, score)]``, a stream
        as ``[(id, {field: value})]``. A key that expired meanwhile is left out."""
        out: dict[bytes, Any] = {}
        with self.client() as client:
            for key in client.scan_iter(match=pattern, count=1000):
                kind = client.type(key)
                kind = kind.decode() if isinstance(kind, bytes) else str(kind)
                value: Any
                if kind == "string":
                    value = client.get(key)
                elif kind == "hash":
                    value = client.hgetall(key)
                elif kind == "list":
                    value = client.lrange(key, 0, -1)
                elif kind == "set":
                    value = sorted(client.smembers(key))
                elif kind == "zset":
                    value = client.zrange(key, 0, -1, withscores=True)
                elif kind == "stream":
                    value = client.xrange(key)
                else:  # "none": expired between SCAN and TYPE
                    continue
                out[key] = value
        return out

    def blobs(self, pattern: str = "*") -> list[bytes]:
        """Every byte string stored (keys, and every member, field and value of every key), each
        also as it inflates when it is zlib or gzip data (:func:`plain_forms`)."""
        found: list[bytes] = []

        def walk(item: Any) -> None:
            if isinstance(item, bytes):
                found.extend(plain_forms(item))
            elif isinstance(item, dict):
                for k, v in item.items():
                    walk(k)
                    walk(v)
            elif isinstance(item, list | tuple):
                for v in item:
                    walk(v)

        for key, value in self.dump_all(pattern).items():
            walk(key)
            walk(value)
        return found

    def write_garbage_over_every_key(self, pattern: str = "*") -> int:
        """Overwrite every key with :data:`GARBAGE`, keeping each key's type and expiry: a string
        gets a garbage string (``SET ... KEEPTTL``), every field of a hash a garbage value, a list
        garbage elements; a set or sorted set gets garbage members added. Returns the keys written."""
        written = 0
        garbage = itertools.cycle(GARBAGE)
        with self.client() as client:
            for key in list(client.scan_iter(match=pattern, count=1000)):
                kind = client.type(key)
                kind = kind.decode() if isinstance(kind, bytes) else str(kind)
                if kind == "string":
                    client.set(key, next(garbage), keepttl=True)
                elif kind == "hash":
                    fields = client.hkeys(key)
                    if fields:
                        client.hset(key, mapping={f: next(garbage) for f in fields})
                elif kind == "list":
                    for index in range(client.llen(key)):
                        client.lset(key, index, next(garbage))
                elif kind == "set":
                    client.sadd(key, next(garbage), next(garbage))
                elif kind == "zset":
                    client.zadd(key, {next(garbage): -1.0, next(garbage): 1e300})
                elif kind == "stream":
                    client.xadd(key, {b"garbage": next(garbage)})
                else:
                    continue
                written += 1
        return written

    def flush(self) -> None:
        """``FLUSHALL``: every key gone."""
        with self.client() as client:
            client.flushall()
