"""A real Prometheus server, with the shipped scrape config pointed at a running gateway,
reads back the cache hits and misses the test drove (issue: monitoring)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import parse_config
from gateway.protocol import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "deploy" / "prometheus"
V = "2026-07-28"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    assert path, "prometheus is not installed (make test installs the Debian package)"
    return path


def start_prometheus(binary: str, tmp: Path, gateway_port: int) -> tuple[subprocess.Popen[bytes], int]:
    config = yaml.safe_load((SHIPPED / "prometheus.yml").read_text())
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "mcp-gateway"]
    assert len(jobs) == 1 and jobs[0]["static_configs"][0]["targets"] == ["127.0.0.1:8080"]
    jobs[0]["static_configs"][0]["targets"] = [f"127.0.0.1:{gateway_port}"]  # the only change
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    for rule_file in config.get("rule_files", []):
        shutil.copy(SHIPPED / rule_file, tmp / rule_file)
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=(tmp / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, port


@pytest.fixture
def tmp_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


async def upstream_app() -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        msg = orjson.loads(await request.read())
        result = {"tools": [], "resultType": "complete", "cacheScope": "public", "ttlMs": 600_000}
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    app = web.Application()
    app.router.add_post("/mcp", handle)
    return app


async def query(session: aiohttp.ClientSession, port: int, promql: str) -> float | None:
    try:
        async with session.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": promql}) as resp:
            if resp.status != 200:
                return None
            data: dict[str, Any] = await resp.json()
    except aiohttp.ClientConnectionError:
        return None  # Prometheus is still starting
    result = data["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.mark.timeout(90)
async def test_prometheus_reads_back_the_hits_and_misses_driven(prometheus_bin: str, tmp_dir: Path) -> None:
    upstream = TestServer(await upstream_app(), host="127.0.0.1")
    await upstream.start_server()
    config = parse_config({"upstreams": {"fleet": {"url": str(upstream.make_url("/mcp"))}}}, env={})
    gateway = TestServer(create_app(config), host="127.0.0.1")
    await gateway.start_server()
    assert gateway.port is not None
    proc, prom_port = start_prometheus(prometheus_bin, tmp_dir, gateway.port)
    misses, hits = 4, 11
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(misses + hits):
                cursor = str(i) if i < misses else "0"  # 4 distinct keys, then 11 repeats of the first
                meta = {PROTOCOL_VERSION_KEY: V, CLIENT_CAPABILITIES_KEY: {}}
                body = {"jsonrpc": "2.0", "id": i, "method": "tools/list", "params": {"_meta": meta, "cursor": cursor}}
                headers = {"Content-Type": "application/json", "MCP-Protocol-Version": V, "Mcp-Method": "tools/list"}
                async with http.post(
                    gateway.make_url("/servers/fleet/mcp"), data=orjson.dumps(body), headers=headers
                ) as resp:
                    assert resp.status == 200
            deadline = time.monotonic() + 60
            got: tuple[float | None, float | None] = (None, None)
            while time.monotonic() < deadline:
                got = (
                    await query(
                        http, prom_port, 'sum(mcp_gateway_cache_lookups_total{job="mcp-gateway",result="hit"})'
                    ),
                    await query(
                        http, prom_port, 'sum(mcp_gateway_cache_lookups_total{job="mcp-gateway",result="miss"})'
                    ),
                )
                if got == (hits, misses):
                    break
                assert proc.poll() is None, (tmp_dir / "prometheus.log").read_text()[-2000:]
                await asyncio.sleep(0.5)
            assert got == (hits, misses), (tmp_dir / "prometheus.log").read_text()[-2000:]
            up = await query(http, prom_port, 'up{job="mcp-gateway"}')
            assert up == 1.0
    finally:
        proc.terminate()
        proc.wait(10)
        await gateway.close()
        await upstream.close()
