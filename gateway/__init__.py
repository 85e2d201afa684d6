"""Caching discovery gateway for fleets of MCP (2026-07-28) servers.

Public surface: :func:`create_app` builds the aiohttp application for a
:class:`GatewayConfig` (see ``load_config``).
"""

__version__ = "0.1.0"  # before the imports: gateway.aggregate names it in its serverInfo

from .app import create_app
from .config import ConfigError, GatewayConfig, load_config

__all__ = ["ConfigError", "GatewayConfig", "create_app", "load_config"]
