"""``make demo`` and ``mcp-gateway demo`` on a port that is taken: the hint names what the user
typed (the ``PORT=`` of make, or the ``--port`` of the command), so they can change it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support.fleet import HOST

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield sock.getsockname()[1]


def taken(port: int, hint: str) -> str:
    return (
        f"mcp-gateway demo: cannot listen on 127.0.0.1:{port} for the gateway (Address already in use); "
        f"is something else using it? Pick another port: {hint}\n"
    )


def environment(**more: str) -> dict[str, str]:
    """This environment without make's variables (these tests may run under ``make test``)."""
    drop = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MCP_GATEWAY_VIA_MAKE"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **more}


def test_mcp_gateway_demo_on_a_taken_port_names_its_own_option(taken_port: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", str(taken_port)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=environment(),
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == taken(taken_port, "mcp-gateway demo --port 18080")


def test_make_demo_on_a_taken_port_names_make_demo_port(taken_port: int) -> None:
    # -o: the demo's install stamp counts as done (the test extras hold the demo's packages).
    done = subprocess.run(
        ["make", "-s", "-o", ".venv/.installed-demo", "demo", f"PORT={taken_port}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=environment(),
    )
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith(taken(taken_port, "make demo PORT=18080")), done.stderr


def test_make_demo_with_a_port_that_is_not_one_names_port() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=environment(MCP_GATEWAY_VIA_MAKE="1"),
    )
    assert (done.returncode, done.stderr) == (1, "mcp-gateway demo: PORT=70000 is not a TCP port (0-65535)\n")
