"""The ``mcp-gateway`` command: ``serve``, ``check-config`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import glob
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from aiohttp import web
from prometheus_client.multiprocess import mark_process_dead

from .config import ConfigError, GatewayConfig, load_config
from .telemetry import ACCESS_LOGGER, MULTIPROC_DIR_ENV, AccessLogHandler, MultiProcessRegistry, quiet_server_errors

__all__ = ["main"]

EXIT_CONFIG = 2
#: Listen backlog of the sockets bound for ``--workers`` (aiohttp's default is 128).
BACKLOG: Final = 1024


def _config_path(arg: str | None) -> str:
    path = arg or os.environ.get("MCP_GATEWAY_CONFIG")
    if not path:
        print("mcp-gateway: no config: pass --config PATH or set MCP_GATEWAY_CONFIG", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    return path


def _load(path: str) -> GatewayConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"mcp-gateway: invalid config: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from exc


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def setup_logging(level: str, fmt: str) -> None:
    """Log to stderr; ``fmt`` is ``json`` (one object per line) or ``text``.

    In JSON, the access log (``mcp_gateway.access``, one line per MCP request at INFO) has
    its own :class:`~gateway.telemetry.AccessLogHandler`: the same line shape, at a fraction
    of the cost of a ``logging`` record, which matters on the cached path.
    """
    handler = logging.StreamHandler()
    access = logging.getLogger(ACCESS_LOGGER)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level"})
        )
        access.handlers[:] = [AccessLogHandler()]
        access.propagate = False
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        access.handlers[:] = []
        access.propagate = True
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet_server_errors()  # aiohttp's bad-request errors quote the raw request: one short line each


class _TextFormatter(logging.Formatter):
    """Plain text, with the fields a record carries through ``extra=`` (the access log's
    :func:`~gateway.telemetry.request_fields`) appended as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}
        return line + "".join(f" {k}={v}" for k, v in extra.items()) if extra else line


_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

#: How long a stopping gateway waits for requests still being answered, in seconds (SSE
#: relays are ended first, see Proxy.close_streams), well inside Kubernetes' 30 s grace.
SHUTDOWN_TIMEOUT_S: Final = 10.0

LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")


#: ``--loop`` values: ``auto`` is uvloop when it is installed (the ``speed`` extra), else asyncio.
LOOPS: Final = ("auto", "uvloop", "asyncio")


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new event loop of ``kind`` (see :data:`LOOPS`).

    Raises:
        SystemExit: ``uvloop`` was asked for and is not installed.
    """
    if kind == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError as exc:  # optional speed-up
        if kind == "uvloop":
            raise SystemExit(
                "mcp-gateway: --loop uvloop: uvloop is not installed (pip install 'mcp-gateway[speed]')"
            ) from exc
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def bind_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening TCP sockets on ``host:port``, all with ``SO_REUSEPORT``.

    The kernel spreads incoming connections over them (Linux). With ``port`` 0 the first
    socket picks a free port and the others join it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(BACKLOG)
            sock.set_inheritable(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def run_workers(
    socks: Sequence[socket.socket],
    run_one: Callable[[socket.socket], None],
    *,
    on_exit: Callable[[int], None] | None = None,
) -> int:
    """Fork one worker process per socket, each calling ``run_one(sock)``; supervise them.

    SIGINT/SIGTERM to this (parent) process stop every worker (SIGTERM, which
    ``aiohttp.web.run_app`` turns into a graceful shutdown). If a worker dies on its own,
    the others are stopped too and the exit status is 1: the process supervisor (systemd,
    Kubernetes) restarts the whole gateway, so no worker silently goes missing.
    ``on_exit(pid)`` is called once each worker has exited and been reaped.
    """
    log = logging.getLogger("mcp_gateway")
    workers: dict[int, int] = {}
    for index, sock in enumerate(socks):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                for other in socks:
                    if other is not sock:
                        other.close()
                run_one(sock)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                log.exception("worker %d failed", index)
            finally:
                logging.shutdown()  # os._exit skips atexit: write the queued access-log lines
                os._exit(code)
        workers[pid] = index
    for sock in socks:
        sock.close()

    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    while workers:
        pid, wait_status = os.wait()
        if pid not in workers:
            continue
        index = workers.pop(pid)
        code = os.waitstatus_to_exitcode(wait_status)
        if on_exit is not None:
            on_exit(pid)
        if not stopping:
            log.error("worker %d (pid %d) exited with %d; stopping the others", index, pid, code)
            status = 1
            stop(signal.SIGTERM, None)
    return status


@contextlib.contextmanager
def metrics_dir() -> Iterator[str]:
    """The directory of a process group's metric files (prometheus_client multiprocess mode):
    ``$PROMETHEUS_MULTIPROC_DIR`` when the operator set it (created if missing; the ``*.db``
    files of an earlier run removed first, as prometheus_client advises, and left at exit), else
    a new temporary directory, removed at exit."""
    given = os.environ.get(MULTIPROC_DIR_ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        for stale in glob.glob(os.path.join(glob.escape(given), "*.db")):
            os.remove(stale)
        yield given
        return
    path = tempfile.mkdtemp(prefix="mcp-gateway-metrics-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def serve(
    config: GatewayConfig,
    *,
    host: str | None = None,
    port: int | None = None,
    workers: int = 1,
    loop: str = "auto",
    hot_path: bool = True,
) -> int:
    """Run the gateway until interrupted on the event loop ``loop`` (see :data:`LOOPS`); returns
    the exit status.

    ``workers`` > 1 runs that many processes accepting on one port (``SO_REUSEPORT``,
    Linux). Each worker has its own cache and coalescing: without ``[cluster]`` a cold key is
    fetched upstream once per worker; purges and listen-stream notifications reach every
    worker. The metrics are the group's: the workers keep them in files in :func:`metrics_dir`
    (prometheus_client multiprocess mode), and ``/metrics``, whichever worker answers it,
    reports the sum over all of them (``gateway.telemetry.metrics``).
    """
    from .app import create_app

    bind_host = host or config.listener.host
    bind_port = config.listener.port if port is None else port
    log = logging.getLogger("mcp_gateway")

    def run_one(sock: socket.socket | None, group_dir: str | None = None, bus_dir: str | None = None) -> None:
        # In the worker, after the fork: its metrics are created here, in multiprocess mode.
        registry = None if group_dir is None else MultiProcessRegistry(group_dir)
        web.run_app(
            create_app(config, hot_path=hot_path, metrics_registry=registry, worker_bus=bus_dir),
            host=None if sock else bind_host,
            port=None if sock else bind_port,
            sock=sock,
            handler_cancellation=True,  # a caller that disconnects cancels its upstream request
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            access_log=None,
            print=lambda msg: log.info(msg),
            loop=new_event_loop(loop),
        )

    if workers <= 1:
        run_one(None)
        return 0
    socks = bind_sockets(bind_host, bind_port, workers)
    log.info("serving on %s:%d with %d workers", bind_host, socks[0].getsockname()[1], workers)
    with metrics_dir() as path, tempfile.TemporaryDirectory(prefix="mcp-gateway-bus-") as bus_dir:
        return run_workers(
            socks,
            # Without [cluster], purges and notifications reach the other workers through a bus
            # (gateway.cluster.workers); with it, through Redis, as they reach other replicas.
            functools.partial(run_one, group_dir=path, bus_dir=None if config.cluster else bus_dir),
            on_exit=functools.partial(mark_process_dead, path=path),  # its live* gauges leave the sums
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="Caching discovery gateway for MCP servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the gateway")
    p_serve.add_argument("--config", help="TOML config file (default: $MCP_GATEWAY_CONFIG)")
    p_serve.add_argument("--host", help="override listener.host")
    p_serve.add_argument("--port", type=int, help="override listener.port")
    p_serve.add_argument(
        "--workers",
        type=_positive_int,
        default=os.environ.get("MCP_GATEWAY_WORKERS", "1"),
        help="worker processes sharing the port via SO_REUSEPORT, each with its own cache; "
        "/metrics reports the sum over them (default 1)",
    )
    p_serve.add_argument(
        "--loop",
        choices=LOOPS,
        default=os.environ.get("MCP_GATEWAY_LOOP", "auto"),
        help="event loop: auto (uvloop when installed, the default), uvloop or asyncio",
    )
    p_serve.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=os.environ.get("MCP_GATEWAY_LOG_LEVEL", "info").lower(),
        help="default info (one access-log line per request); warning silences the access log",
    )
    p_serve.add_argument(
        "--log-format", choices=("json", "text"), default=os.environ.get("MCP_GATEWAY_LOG_FORMAT", "json")
    )
    p_serve.add_argument(
        "--plain-path",
        action="store_true",
        help="answer cache hits on the plain path, without the hit path's speed-ups (to measure them)",
    )
    p_check = sub.add_parser("check-config", help="validate a config file (exit 0, or 2 naming the bad key)")
    p_check.add_argument("path")
    p_demo = sub.add_parser("demo", help="start a demo fleet of real MCP servers behind the gateway")
    p_demo.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    args = parser.parse_args(argv)

    if args.command == "check-config":
        config = _load(args.path)
        print(f"{args.path}: ok ({len(config.upstreams)} upstreams: {', '.join(config.upstreams) or 'none'})")
        return 0
    if args.command == "serve":
        setup_logging(args.log_level, args.log_format)
        return serve(
            _load(_config_path(args.config)),
            host=args.host,
            port=args.port,
            workers=args.workers,
            loop=args.loop,
            hot_path=not args.plain_path,
        )
    from .demo import run_demo

    return run_demo(gateway_port=args.port)


if __name__ == "__main__":
    sys.exit(main())
