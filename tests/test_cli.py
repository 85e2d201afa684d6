"""``mcp-gateway serve`` as operators start it: every start-up failure is one line on stderr and
exit status 2, and ``--workers N`` holds its port like any other program.

Each test runs the real command (``python -m gateway.cli serve``) in a process of its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support.fleet import DIRECT, HOST, free_port, healthy

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
FIX_PORT = "pick another port with --port or listener.port"
FIX_HOST = "set --host or listener.host to an address of this machine (127.0.0.1: this machine only, 0.0.0.0: all)"

pytestmark = pytest.mark.timeout(90)


def in_use(port: int) -> str:
    return (
        f"mcp-gateway: cannot listen on 127.0.0.1:{port}: address already in use (another program listens "
        f"there, perhaps another mcp-gateway); stop it or {FIX_PORT}\n"
    )


def write_config(directory: Path, port: int, extra: str = "") -> Path:
    """A gateway config on 127.0.0.1:``port``, the registry off (no probes of the dead upstream)."""
    path = directory / "gateway.toml"
    path.write_text(
        f'[listener]\nport = {port}\n[registry]\nenabled = false\n[upstreams.up]\nurl = "http://{HOST}:9/mcp"\n' + extra
    )
    return path


def serve(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``mcp-gateway serve ARGS`` run to its end (a start-up failure ends it at once)."""
    argv = [*prefix, sys.executable, "-m", "gateway.cli", "serve", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)


@contextlib.contextmanager
def running(config: Path, port: int, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``mcp-gateway serve --config CONFIG ARGS`` until it answers ``/healthz`` on ``port``;
    SIGTERM (then SIGKILL to its process group, workers included) at the end."""
    log = config.with_suffix(".log")
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--log-level", "warning", *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(port):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, f"no /healthz within {START_TIMEOUT_S} s:\n{log.read_text()}"
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def listening(port: int = 0) -> Iterator[int]:
    """Another program listening on 127.0.0.1 (a plain socket, no SO_REUSEPORT); yields its port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, port))
        sock.listen()
        yield sock.getsockname()[1]


# -- one line, exit 2 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_port_in_use_is_one_plain_line_on_stderr_and_exit_2_whatever_the_log_format(
    tmp_path: Path, workers: str, log_format: str
) -> None:
    with listening() as port:
        done = serve("--config", str(write_config(tmp_path, port)), "--workers", workers, "--log-format", log_format)
    assert (done.returncode, done.stderr, done.stdout) == (2, in_use(port), "")


def test_with_log_level_debug_the_traceback_follows_the_line(tmp_path: Path) -> None:
    with listening() as port:
        done = serve("--config", str(write_config(tmp_path, port)), "--log-level", "debug")
    assert done.returncode == 2
    first, *rest = done.stderr.splitlines(keepends=True)
    assert first == in_use(port)
    assert rest[0] == "Traceback (most recent call last):\n"
    assert rest[-1] == "OSError: [Errno 98] Address already in use\n"


def test_an_address_that_is_not_this_machines_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    done = serve("--config", str(write_config(tmp_path, port)), "--host", "192.0.2.1")  # TEST-NET-1
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"mcp-gateway: cannot listen on 192.0.2.1:{port}: 192.0.2.1 is not an address of this machine; {FIX_HOST}\n"
    )


def test_a_host_name_that_does_not_resolve_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(socket.gaierror) as resolver:  # the resolver's own words, as the gateway quotes them
        socket.getaddrinfo("nosuch.invalid", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    done = serve("--config", str(write_config(tmp_path, port)), "--host", "nosuch.invalid")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"mcp-gateway: cannot listen on nosuch.invalid:{port}: the host name does not resolve "
        f"({resolver.value.strerror}); {FIX_HOST}\n"
    )


def test_a_port_below_1024_without_privileges_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Port 1 without CAP_NET_BIND_SERVICE: dropped with ``setpriv`` when the tests run as root."""
    if int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()) <= 1:
        pytest.skip("this kernel lets every process bind port 1 (net.ipv4.ip_unprivileged_port_start)")
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and no setpriv (util-linux) to drop CAP_NET_BIND_SERVICE")
        prefix = (setpriv, "--bounding-set", "-net_bind_service", "--inh-caps", "-net_bind_service")
    done = serve("--config", str(write_config(tmp_path, 1)), prefix=prefix)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "mcp-gateway: cannot listen on 127.0.0.1:1: permission denied (ports below 1024 need root or "
        "CAP_NET_BIND_SERVICE); pick a port from 1024 up with --port or listener.port\n"
    )


def test_an_unknown_config_key_is_one_line_with_the_key_meant_and_its_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), "[cache]\nmax_entries = 5\nmax_ttl_msec = 1000\n")
    done = serve("--config", str(config))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"mcp-gateway: invalid config: {config}: line 9: cache.max_ttl_msec: unknown key (did you mean `max_ttl_ms`?)\n"
    )


def test_a_toml_syntax_error_is_one_line_with_the_parsers_line(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[listener]\nport = 8080\n[upstreams.up\nurl = "http://127.0.0.1:9/mcp"\n')
    done = serve("--config", str(config))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"mcp-gateway: invalid config: {config}: invalid TOML: "
        "Expected ']' at the end of a table declaration (at line 3, column 14)\n"
    )


def test_no_config_at_all_is_one_line_and_exit_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MCP_GATEWAY_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "mcp-gateway: no config: pass --config PATH or set MCP_GATEWAY_CONFIG\n"


# -- --workers N: one socket, bound once ----------------------------------------------------------------------


def test_a_second_workers_gateway_on_the_port_of_a_first_is_refused_and_the_first_keeps_serving(
    tmp_path: Path,
) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    port = free_port()
    with running(write_config(first_dir, port), port, "--workers", "2") as first:
        second = serve("--config", str(write_config(second_dir, port)), "--workers", "2")
        assert (second.returncode, second.stderr, second.stdout) == (2, in_use(port), "")
        single = serve("--config", str(write_config(second_dir, port)))  # one worker: refused too
        assert (single.returncode, single.stderr) == (2, in_use(port))
        assert first.poll() is None
        assert all(healthy(port) for _ in range(20))  # each on a new connection, either worker


def test_a_gateway_restarted_at_once_on_its_port_binds_it_despite_the_connections_it_just_closed(
    tmp_path: Path,
) -> None:
    """SO_REUSEADDR: the connections a stopping gateway closed (TIME_WAIT) do not hold the port."""
    port = free_port()
    config = write_config(tmp_path, port)
    with running(config, port, "--workers", "2") as first:
        with socket.create_connection((HOST, port)) as kept:  # a keep-alive connection the gateway closes
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert kept.recv(4096).startswith(b"HTTP/1.1 200")
            first.send_signal(signal.SIGTERM)
            assert first.wait(STOP_TIMEOUT_S) == 0
    with running(config, port, "--workers", "2"):
        assert healthy(port)


def test_the_host_check_follows_the_address_serve_binds_not_the_one_in_the_file(tmp_path: Path) -> None:
    """listener.host 0.0.0.0 in the file, --host 127.0.0.1 on the command line: a loopback bind,
    so a foreign Host is refused (421), as if the file said 127.0.0.1."""
    port = free_port()
    config = write_config(tmp_path, port).read_text().replace("[listener]\n", '[listener]\nhost = "0.0.0.0"\n')
    path = tmp_path / "wide.toml"
    path.write_text(config)
    with running(path, port, "--host", HOST):
        request = urllib.request.Request(f"http://{HOST}:{port}/registry/versions", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            DIRECT.open(request, timeout=5)
        assert refused.value.code == 421
