"""The ``mcp-gateway`` command: ``serve``, ``check-config`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import importlib.util
import logging
import os
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import Final

from aiohttp import web
from prometheus_client.multiprocess import mark_process_dead

from .config import ConfigError, GatewayConfig, LoadedConfig, read_config
from .httpserver import install_json_errors
from .relay import EarlyHangup, GroupReload
from .telemetry import ACCESS_LOGGER, AccessLogHandler, MultiProcessRegistry, quiet_server_errors
from .telemetry.group import metrics_dir
from .watch import reloading_on_change

__all__ = ["main"]

#: Exit status of every start-up failure (config, listening socket, event loop) and of a bad
#: ``check-config``; argparse uses it for bad arguments too.
EXIT_CONFIG: Final = 2
#: Listen backlog of the gateway's listening sockets (aiohttp's default is 128).
BACKLOG: Final = 1024


class StartupError(Exception):
    """``serve`` cannot start. The message is the one line printed on stderr (after
    ``mcp-gateway: ``): what went wrong and what to do about it. Exit status :data:`EXIT_CONFIG`."""


def _config_path(arg: str | None) -> str:
    path = arg or os.environ.get("MCP_GATEWAY_CONFIG")
    if not path:
        raise StartupError("no config: pass --config PATH or set MCP_GATEWAY_CONFIG")
    return path


def _load(path: str) -> LoadedConfig:
    """``path`` read and validated, as a reload does (:func:`~gateway.config.read_config`)."""
    try:
        return read_config(path)
    except ConfigError as exc:
        raise StartupError(f"invalid config: {exc}") from exc


def _bound(config: GatewayConfig, host: str, port: int) -> GatewayConfig:
    """``config`` listening on ``host:port`` (``--host``, ``--port``): the app sees where it
    listens (the Host check of a loopback bind depends on it)."""
    if (host, port) == (config.listener.host, config.listener.port):
        return config
    return config.model_copy(update={"listener": config.listener.model_copy(update={"host": host, "port": port})})


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _port(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port (0-65535; 0: any free port)")
    return int(value)


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


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_error(host: str, port: int, exc: OSError, address: str | None = None) -> str:
    """The one line (after ``mcp-gateway: ``) saying why ``host:port`` cannot be listened on,
    and what to do: for a port in use, a port that needs privileges, an address that is not
    this machine's, a name that does not resolve; else the system's words. ``address``: the
    one of the addresses ``host`` resolves to that failed, when it is not ``host`` itself."""
    where = f"cannot listen on {_where(host, port)}"
    if address is not None and address != host:
        where += f" ({_where(address, port)})"
    port_fix = "pick another port with --port or listener.port"
    host_fix = "set --host or listener.host to an address of this machine (127.0.0.1: this machine only, 0.0.0.0: all)"
    if isinstance(exc, socket.gaierror):
        return f"{where}: the host name does not resolve ({exc.strerror}); {host_fix}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: address already in use (another program listens there, perhaps another "
            f"mcp-gateway); stop it or {port_fix}"
        )
    if exc.errno == errno.EACCES:
        if 0 < port < 1024:
            return (
                f"{where}: permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE); "
                f"pick a port from 1024 up with --port or listener.port"
            )
        return f"{where}: permission denied; {port_fix}, or allow this user to bind it"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {address or host} is not an address of this machine; {host_fix}"
    return f"{where}: {exc.strerror or exc}; check --host and --port (listener.host, listener.port)"


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """The gateway's listening TCP sockets on ``host:port``, bound once, in this process.

    One socket per address ``host`` resolves to, as aiohttp's own ``TCPSite`` binds
    (``localhost``: 127.0.0.1 and ::1 where both resolve; ``""``: every interface); with port 0
    the first picks a free port and the others take the same one. ``SO_REUSEADDR`` (a restart
    need not wait out TIME_WAIT) but no ``SO_REUSEPORT``: while these are open no other process
    can listen on the port, another gateway or not. ``--workers`` processes forked afterwards
    inherit them and all accept on them.

    Raises:
        StartupError: ``host`` does not resolve or an address cannot be bound (:func:`listen_error`).
    """
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(listen_error(host, port, exc)) from exc
    socks: list[socket.socket] = []
    seen: set[tuple[int, str]] = set()
    ip = host
    try:
        for family, kind, proto, _, address in infos:
            ip = str(address[0])
            if (family, ip) in seen:
                continue
            seen.add((family, ip))
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # an address family this kernel lacks (no IPv6): skipped, as asyncio does
                continue
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # so that "::" and "0.0.0.0" can both be bound
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((ip, port, *address[2:]))
            port = sock.getsockname()[1]
            sock.listen(BACKLOG)
    except OSError as exc:
        for sock in socks:
            sock.close()
        raise StartupError(listen_error(host, port, exc, ip)) from exc
    if not socks:
        raise StartupError(listen_error(host, port, OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))))
    return socks


def fork_workers(
    count: int,
    run_one: Callable[[int], None],
    *,
    listeners: Sequence[socket.socket] = (),
    on_exit: Callable[[int], None] | None = None,
    group: GroupReload | None = None,
) -> int:
    """Fork ``count`` worker processes, worker ``i`` calling ``run_one(i)``; supervise them.

    The workers inherit ``listeners`` (a fork keeps every open socket); this (parent) process
    closes its own copies once they are all forked, so the port is free again when the last
    worker exits. SIGINT/SIGTERM to the parent stop every worker (SIGTERM, which
    ``aiohttp.web.run_app`` turns into a graceful shutdown). If a worker dies on its own,
    the others are stopped too and the exit status is 1: the process supervisor (systemd,
    Kubernetes) restarts the whole gateway, so no worker silently goes missing.
    ``on_exit(pid)`` is called once each worker has exited and been reaped. SIGHUP to the parent
    is passed on to every worker, and a worker's ``POST /admin/reload`` to the others, through
    ``group`` (:mod:`gateway.relay`).
    """
    log = logging.getLogger("mcp_gateway")
    workers: dict[int, int] = {}
    group = group or GroupReload()
    group.install(workers)
    for index in range(count):
        pid = os.fork()
        if pid == 0:  # the worker
            group.in_worker()
            code = 1
            try:
                run_one(index)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                log.exception("worker %d failed", index)
            finally:
                logging.shutdown()  # os._exit skips atexit: write the queued access-log lines
                os._exit(code)
        workers[pid] = index
    group.in_parent()
    for sock in listeners:
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
    group.close()
    return status


def serve(
    config: GatewayConfig,
    *,
    config_path: str | None = None,
    sha256: str | None = None,
    host: str | None = None,
    port: int | None = None,
    workers: int = 1,
    loop: str = "auto",
    hot_path: bool = True,
    watch: bool = False,
) -> int:
    """Run the gateway until interrupted on the event loop ``loop`` (see :data:`LOOPS`); returns
    the exit status.

    The listening socket is bound here, before anything else starts (:func:`bind_listeners`),
    so that a port in use or an address that cannot be bound is a :class:`StartupError`.
    ``workers`` > 1 forks that many processes after binding, all accepting on that one socket
    (no ``SO_REUSEPORT``: a second gateway on the port fails to bind like any program). Each
    worker has its own cache and coalescing: without ``[cluster]`` a cold key is
    fetched upstream once per worker; purges and listen-stream notifications reach every
    worker. The metrics are the group's: the workers keep them in files in :func:`metrics_dir`
    (prometheus_client multiprocess mode), and ``/metrics``, whichever worker answers it,
    reports the sum over all of them (``gateway.telemetry.metrics``). ``config_path`` (with
    ``sha256``, of its bytes) is the file ``config`` was read from: ``SIGHUP`` and
    ``POST /admin/reload`` read it again (:mod:`gateway.reload`; in a group every worker does,
    :mod:`gateway.relay`), and so does a change to it with ``watch`` (:mod:`gateway.watch`).

    Raises:
        StartupError: the socket cannot be bound, or ``loop`` is ``uvloop`` and it is not installed.
    """
    from .app import RELOADER, create_app, reload_on_sighup

    bind_host = host or config.listener.host
    bind_port = config.listener.port if port is None else port
    config = _bound(config, bind_host, bind_port)
    log = logging.getLogger("mcp_gateway")
    reload_source = None
    if config_path is not None:

        def reload_source() -> LoadedConfig:
            # --host and --port hold for the reloaded config too: no listener change to report.
            loaded = read_config(config_path)
            listener = loaded.config.listener
            bound = _bound(loaded.config, host or listener.host, listener.port if port is None else port)
            return LoadedConfig(bound, loaded.sha256)

    if loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise StartupError(
            "--loop uvloop: uvloop is not installed; pip install 'mcp-gateway[speed]' or use --loop auto"
        )

    group = GroupReload(config_path if watch else None) if workers > 1 else None
    # From here on a SIGHUP is a reload, never the end of a process (in a group, the workers' too).
    hangups: GroupReload | EarlyHangup = group if group is not None else EarlyHangup()

    def run_one(socks: list[socket.socket], group_dir: str | None = None, bus_dir: str | None = None) -> None:
        # In the worker, after the fork: its metrics are created here, in multiprocess mode.
        registry = None if group_dir is None else MultiProcessRegistry(group_dir)
        app = create_app(
            config,
            hot_path=hot_path,
            metrics_registry=registry,
            worker_bus=bus_dir,
            config_sha256=sha256,
            reload_source=reload_source,
            reload_group=None if group is None else group.request,
        )
        app.on_startup.append(reload_on_sighup)
        app.on_startup.append(hangups.after_start(lambda: app[RELOADER].reload()))
        if watch and group is None and config_path is not None:
            app.cleanup_ctx.append(reloading_on_change(config_path, lambda: app[RELOADER].reload()))
        web.run_app(
            app,
            sock=socks,
            backlog=BACKLOG,  # asyncio listens again on the socket it is given, with this backlog
            handler_cancellation=True,  # a caller that disconnects cancels its upstream request
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            access_log=None,
            print=lambda msg: log.info(msg),
            loop=new_event_loop(loop),
        )

    socks = bind_listeners(bind_host, bind_port)
    install_json_errors()  # aiohttp's answers to requests it cannot parse quote them: JSON-RPC errors instead
    if workers <= 1:
        try:
            run_one(socks)
        finally:
            for sock in socks:
                sock.close()
        return 0
    where = ", ".join(_where(*sock.getsockname()[:2]) for sock in socks)
    log.info("serving on %s with %d workers", where, workers)
    with metrics_dir() as path, tempfile.TemporaryDirectory(prefix="mcp-gateway-bus-") as bus_dir:
        # Purges and notifications reach the other workers through a bus (gateway.cluster.workers),
        # with [cluster] too: through Redis as well, but a purge must reach them while it is down.
        one = functools.partial(run_one, socks, group_dir=path, bus_dir=bus_dir)
        return fork_workers(
            workers,
            lambda _index: one(),
            listeners=socks,
            on_exit=functools.partial(mark_process_dead, path=path),  # its live* gauges leave the sums
            group=group,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="Caching discovery gateway for MCP servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser(
        "serve",
        help="run the gateway",
        description="Run the gateway. A start-up failure (config, port, address) is one line on stderr, "
        "exit status 2; with --log-level debug its traceback follows.",
    )
    p_serve.add_argument("--config", help="TOML config file (default: $MCP_GATEWAY_CONFIG)")
    p_serve.add_argument("--host", help="override listener.host")
    p_serve.add_argument("--port", type=_port, help="override listener.port")
    p_serve.add_argument(
        "--workers",
        type=_positive_int,
        default=os.environ.get("MCP_GATEWAY_WORKERS", "1"),
        help="worker processes accepting on the one listening socket, each with its own cache; "
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
        "--watch",
        action="store_true",
        help="reload when the config file, or a ${file:PATH} secret it reads, changes (default off)",
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

    try:
        if args.command == "check-config":
            config = _load(args.path).config
            count = len(config.upstreams)
            summary = f"{count} upstream{'' if count == 1 else 's'}: {', '.join(config.upstreams) or 'none'}"
            if config.aggregate is not None:
                summary += f"; POST /mcp of {', '.join(config.aggregate_members())}"
            print(f"{args.path}: ok ({summary})")
            return 0
        if args.command == "serve":
            setup_logging(args.log_level, args.log_format)
            path = _config_path(args.config)
            loaded = _load(path)
            return serve(
                loaded.config,
                config_path=path,
                sha256=loaded.sha256,
                host=args.host,
                port=args.port,
                workers=args.workers,
                loop=args.loop,
                hot_path=not args.plain_path,
                watch=args.watch,
            )
    except StartupError as exc:
        # Plain text whatever --log-format: it is read by whoever started the gateway (a
        # terminal, `kubectl logs`, `systemctl status`), and nothing was logged before it.
        print(f"mcp-gateway: {exc}", file=sys.stderr, flush=True)
        if args.command == "serve" and args.log_level == "debug":
            traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        return EXIT_CONFIG
    from .demo import run_demo

    return run_demo(gateway_port=args.port)


if __name__ == "__main__":
    sys.exit(main())
