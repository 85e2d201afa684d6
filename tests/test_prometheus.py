"""A real Prometheus server, with the shipped scrape config and alert rules pointed at a running
gateway, reads back the cache hits and misses the test drove, and sees the
shared tier ([cluster]) go down with a real Redis, and the shipped alert on it pending."""

from __future__ import annotations

import asyncio
import shutil
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

from .support import StartUpstream, list_result, mcp_headers, rpc
from .support.fleet import free_port
from .support.redis import RedisServer

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "deploy" / "prometheus"


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
async def test_prometheus_reads_back_the_hits_and_misses_driven(
    prometheus_bin: str, tmp_dir: Path, start_upstream: StartUpstream
) -> None:
    async def answer(request: web.Request, msg: dict[str, Any]) -> web.Response:
        return web.json_response(list_result(msg["id"], ttl_ms=600_000))

    upstream = await start_upstream(answer)
    config = parse_config({"upstreams": {"fleet": {"url": upstream.url}}}, env={})
    gateway = TestServer(create_app(config), host="127.0.0.1")
    await gateway.start_server()
    assert gateway.port is not None
    proc, prom_port = start_prometheus(prometheus_bin, tmp_dir, gateway.port)
    misses, hits = 4, 11
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(misses + hits):
                cursor = str(i) if i < misses else "0"  # 4 distinct keys, then 11 repeats of the first
                body = orjson.dumps(rpc("tools/list", i, cursor=cursor))
                headers = mcp_headers("tools/list")
                async with http.post(gateway.make_url("/servers/fleet/mcp"), data=body, headers=headers) as resp:
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


async def wait_for_value(
    http: aiohttp.ClientSession, port: int, promql: str, want: float, proc: subprocess.Popen[bytes], tmp: Path
) -> None:
    """Query ``promql`` until it reads ``want`` (at most 60 s; Prometheus must stay up)."""
    deadline = time.monotonic() + 60
    got = None
    while time.monotonic() < deadline:
        got = await query(http, port, promql)
        if got == want:
            return
        assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
        await asyncio.sleep(0.5)
    raise AssertionError(f"{promql} read {got}, not {want}\n" + (tmp / "prometheus.log").read_text()[-2000:])


@pytest.mark.timeout(120)
async def test_prometheus_sees_the_shared_tier_go_down_and_the_shipped_alert_pending(
    prometheus_bin: str, tmp_dir: Path, start_upstream: StartUpstream
) -> None:
    async def answer(request: web.Request, msg: dict[str, Any]) -> web.Response:
        return web.json_response(list_result(msg["id"], ttl_ms=600_000))

    redis = RedisServer(tmp_dir / "redis")
    try:
        upstream = await start_upstream(answer)
        config = parse_config(
            {"cluster": {"redis_url": redis.url}, "upstreams": {"fleet": {"url": upstream.url}}}, env={}
        )
        gateway = TestServer(create_app(config), host="127.0.0.1")
        await gateway.start_server()
        assert gateway.port is not None
        proc, prom_port = start_prometheus(prometheus_bin, tmp_dir, gateway.port)
        up = 'mcp_gateway_cluster_up{job="mcp-gateway"}'
        pending = 'ALERTS{alertname="MCPGatewaySharedTierDown", alertstate="pending", job="mcp-gateway"}'
        try:
            async with aiohttp.ClientSession() as http:
                await wait_for_value(http, prom_port, up, 1.0, proc, tmp_dir)
                assert await query(http, prom_port, pending) is None
                redis.stop()
                await wait_for_value(http, prom_port, up, 0.0, proc, tmp_dir)
                await wait_for_value(http, prom_port, pending, 1.0, proc, tmp_dir)
                # callers are still answered while the shared tier is away
                body = orjson.dumps(rpc("tools/list", 1))
                async with http.post(
                    gateway.make_url("/servers/fleet/mcp"), data=body, headers=mcp_headers("tools/list")
                ) as resp:
                    assert resp.status == 200
                redis.start()
                await wait_for_value(http, prom_port, up, 1.0, proc, tmp_dir)
        finally:
            proc.terminate()
            proc.wait(10)
            await gateway.close()
    finally:
        redis.close()
