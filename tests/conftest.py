"""Generic fixtures shared by the test modules.

* ``FakeClock`` / ``fake_clock``: a monotonic clock the test moves by hand, for
  ``create_app(config, clock=...)`` (cache expiry without sleeping).
* ``http``: an ``aiohttp.ClientSession`` without a connection limit (for concurrent callers).
* ``start_gateway``: starts the gateway in-process on 127.0.0.1 from a config dict and
  stops it at the end of the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.cache import Clock
from gateway.config import parse_config


class FakeClock:
    """Monotonic seconds that only move when :meth:`advance` is called."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@dataclass
class RunningGateway:
    """A gateway served in-process by an aiohttp ``TestServer``."""

    server: TestServer
    app: web.Application
    registry: CollectorRegistry

    @property
    def base_url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def url(self, upstream: str) -> str:
        """The MCP endpoint of upstream ``upstream`` behind this gateway."""
        return f"{self.base_url}/servers/{upstream}/mcp"


StartGateway = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    """``await start_gateway(config_dict, clock=None)`` -> :class:`RunningGateway`."""
    servers: list[TestServer] = []

    async def start(config: Mapping[str, Any], *, clock: Clock | None = None) -> RunningGateway:
        registry = CollectorRegistry()
        kwargs: dict[str, Any] = {"metrics_registry": registry}
        if clock is not None:
            kwargs["clock"] = clock
        # The end-to-end tests count upstream requests exactly, so registry probes are off
        # unless a test asks for them (the registry has its own tests).
        app = create_app(parse_config({"registry": {"enabled": False}, **config}), **kwargs)
        server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
        await server.start_server()
        servers.append(server)
        return RunningGateway(server, app, registry)

    yield start
    for server in reversed(servers):
        await server.close()
