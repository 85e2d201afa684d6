"""The gateway served in-process, as the ``start_gateway`` fixture (conftest.py) returns it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry


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


#: ``await start_gateway(config_dict, clock=None)`` -> :class:`RunningGateway`.
StartGateway = Callable[..., Awaitable[RunningGateway]]
