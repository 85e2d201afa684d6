"""What the registry tests share: a gateway in process, scripted upstreams, MCP requests.

Fixtures are in ``conftest.py``; real intervals are short (0.1-0.4 s).
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.app import REGISTRY, STORE, create_app
from gateway.cache import CacheKey, MemoryStore, canonical_json
from gateway.config import parse_config
from gateway.registry import (
    RegistryState,
)

from ..support.fleet import LEGACY_PYTHON
from ..support.scripted_mcp import ScriptedMcp
from ..support.wire import V

LEGACY_V = "2025-11-25"
FUTURE_V = "2099-01-01"
FAST = {
    "probe_min_interval_s": 0.2,
    "probe_max_interval_s": 0.4,
    "probe_timeout_s": 3,
    "backoff_base_s": 0.1,
    "backoff_max_s": 0.4,
}
LIST_CHANGED = {"tools": {"listChanged": True}, "prompts": {"listChanged": True}}
ACCEPT = "application/json, text/event-stream"


class Servers:
    """aiohttp TestServers started by a test (gateway and scripted upstreams), closed at its end."""

    def __init__(self) -> None:
        self.running: list[TestServer] = []

    async def start(self, app: web.Application, port: int | None = None) -> TestServer:
        server = TestServer(app, host="127.0.0.1", port=port)
        await server.start_server()
        self.running.append(server)
        return server

    async def stop(self, server: TestServer) -> None:
        self.running.remove(server)
        await server.close()

    async def upstream(self, scripted: ScriptedMcp, port: int | None = None) -> str:
        return str((await self.start(scripted.app(), port)).make_url("/mcp"))


class Gateway:
    def __init__(self, server: TestServer, app: web.Application, metrics: CollectorRegistry) -> None:
        self.server, self.app, self.metrics = server, app, metrics

    @property
    def base(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def url(self, upstream: str) -> str:
        return f"{self.base}/servers/{upstream}/mcp"

    @property
    def state(self) -> RegistryState:
        return self.app[REGISTRY].state

    @property
    def store(self) -> MemoryStore:
        return self.app[STORE]

    def keys(self, upstream: str) -> list[CacheKey]:
        return [k for k in self.store.keys() if k.upstream == upstream]

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics.get_sample_value(name, labels)


async def start_gateway(
    servers: Servers,
    upstreams: dict[str, Any],
    registry: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Gateway:
    config: dict[str, Any] = {k: v for k, v in kwargs.items() if k in ("auth", "cache")}
    config["upstreams"] = {n: u if isinstance(u, dict) else {"url": u} for n, u in upstreams.items()}
    config["registry"] = {"enabled": False} if registry is None else registry
    metrics = CollectorRegistry()
    extra = {k: v for k, v in kwargs.items() if k in ("rng", "sleep", "clock")}
    app = create_app(parse_config(config, env={}), metrics_registry=metrics, **extra)
    return Gateway(await servers.start(app), app, metrics)


async def get_json(http: aiohttp.ClientSession, url: str, **headers: str) -> tuple[int, Any]:
    async with http.get(url, headers=headers) as resp:
        return resp.status, await resp.json()


async def mcp(
    http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any] | None = None, **headers: str
) -> dict[str, Any]:
    """A modern JSON-RPC request (2026-07-28) through the gateway; returns the response."""
    meta = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**(params or {}), "_meta": meta}}
    hdrs = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": V, "Mcp-Method": method}
    if method == "resources/read":
        hdrs["Mcp-Name"] = (params or {})["uri"]
    async with http.post(url, data=orjson.dumps(body), headers={**hdrs, **headers}) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


def probed(gw: Gateway, name: str, count: int = 1) -> bool:
    return gw.state.upstreams[name].probes >= count


def listening(gw: Gateway, name: str) -> bool:
    return gw.state.upstreams[name].listen.state == "acknowledged"


def key(upstream: str, method: str, **params: Any) -> CacheKey:
    return CacheKey(upstream, method, canonical_json(params), V, None)


def legacy_venv_or_skip() -> None:
    if not LEGACY_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{LEGACY_PYTHON} is missing: run scripts/install-tools.sh (make tools)")
        pytest.skip(f"{LEGACY_PYTHON} is missing: run scripts/install-tools.sh (make tools)")
