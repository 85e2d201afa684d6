"""Instructions per cached ``tools/list``, counted by valgrind's callgrind: the steadiest measure
on a shared machine, where requests/s move by half within a minute.

Usage: python bench/instructions.py LABEL=TREE[=SERVE_ARG...] ...
  e.g. python bench/instructions.py floor=. gateway=. plain=.=--plain-path old=/path/to/old/checkout

For each LABEL, a gateway from the checkout TREE (``python -m gateway.cli serve``, with the
SERVE_ARGs) or, for labels starting with ``floor``, TREE's bench/floor.py answering the upstream's
own bytes, runs under callgrind with instrumentation off; after 400 requests to warm up it is
switched on (``callgrind_control -i on``) for 2,000 cached ``tools/list`` over 8 connections, with
the compact body the SDK clients send. Prints instructions per request. Needs ``valgrind``
(Debian package); binds 127.0.0.1 only; stops what it started.
"""

from __future__ import annotations

import asyncio
import glob
import http.client
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
BODY = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}, separators=(",", ":"))
HEADERS = {
    "Host": HOST,
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": V,
    "Mcp-Method": "tools/list",
}
REQUEST = (
    "POST /servers/workspace/mcp HTTP/1.1\r\n"
    + "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
    + f"Content-Length: {len(BODY)}\r\n\r\n"
    + BODY
).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, limit_s: float = 120) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            socket.create_connection((HOST, port), 1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"nothing listens on {HOST}:{port}")


async def drive(port: int, count: int, connections: int = 8) -> None:
    """``count`` requests over ``connections`` keep-alive connections, each read whole."""

    async def one(requests: int) -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        for _ in range(requests):
            writer.write(REQUEST)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"Content-Length: (\d+)", head, re.IGNORECASE)
            assert length is not None
            await reader.readexactly(int(length.group(1)))
        writer.close()

    await asyncio.gather(*(one(count // connections) for _ in range(connections)))


def per_request(argv: list[str], port: int, cwd: str, count: int = 2000) -> float:
    """Instructions per request of the server ``argv`` (listening on ``port``) under callgrind."""
    out = tempfile.mkdtemp()
    callgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.%p"]
    proc = subprocess.Popen(callgrind + argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        asyncio.run(drive(port, 400))
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True}
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], **quiet)  # type: ignore[call-overload]
        asyncio.run(drive(port, count))
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], **quiet)  # type: ignore[call-overload]
    finally:
        proc.terminate()
        proc.wait(60)
    total = 0
    for name in glob.glob(f"{out}/cg.*"):
        for line in Path(name).read_text().splitlines():
            if line.startswith(("totals:", "summary:")):
                total = max(total, int(line.split()[1]))
    return total / count


def gateway_config(port: int, upstream_port: int) -> Path:
    path = Path(tempfile.mkdtemp()) / "gateway.toml"
    path.write_text(f'[listener]\nport = {port}\n[upstreams.workspace]\nurl = "http://{HOST}:{upstream_port}/mcp"\n')
    return path


def upstream_bytes(upstream_port: int) -> Path:
    """The upstream's own answer to ``tools/list``: what the floor answers."""
    conn = http.client.HTTPConnection(HOST, upstream_port)
    conn.request("POST", "/mcp", BODY, {k: v for k, v in HEADERS.items() if k != "Host"})
    path = Path(tempfile.mkdtemp()) / "tools-list.json"
    path.write_bytes(conn.getresponse().read())
    return path


def main(targets: list[str]) -> None:
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [PY, str(ROOT / "bench" / "upstream_25_tools.py"), str(upstream_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(upstream_port)
        for target in targets:
            label, tree, *serve_args = target.split("=")
            tree = str(Path(tree).resolve())
            port = free_port()
            if label.startswith("floor"):
                argv = [PY, f"{tree}/bench/floor.py", "--port", str(port), "--workers", "1"]
                argv += ["--body", str(upstream_bytes(upstream_port))]
            else:
                config = gateway_config(port, upstream_port)
                argv = [PY, "-m", "gateway.cli", "serve", "--config", str(config), *serve_args]
            count = per_request(argv, port, tree)
            print(f"{label}: {count / 1000:.1f}k instructions per cached tools/list", flush=True)
    finally:
        upstream.terminate()
        upstream.wait(30)


if __name__ == "__main__":
    main(sys.argv[1:] or ["floor=.", "gateway=.", "plain=.=--plain-path"])
