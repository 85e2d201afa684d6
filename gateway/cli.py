"""The ``mcp-gateway`` command: ``serve``, ``check-config`` and ``demo``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from aiohttp import web

from .config import ConfigError, GatewayConfig, load_config

__all__ = ["main"]

EXIT_CONFIG = 2


def _config_path(arg: str | None) -> str:
    path = arg or os.environ.get("MCP_GATEWAY_CONFIG")
    if not path:
        print("mcp-gateway: no config: pass --config PATH or set MCP_GATEWAY_CONFIG", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    return path


def _load(path: str) -> GatewayConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"mcp-gateway: invalid config: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from exc


def setup_logging(level: str, fmt: str) -> None:
    """Log to stderr; ``fmt`` is ``json`` (one object per line) or ``text``."""
    handler = logging.StreamHandler()
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level"})
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def serve(config: GatewayConfig, *, host: str | None = None, port: int | None = None) -> None:
    """Run the gateway until interrupted (uvloop when installed)."""
    from .app import create_app

    loop_factory = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # optional speed-up
        pass
    import asyncio

    loop = loop_factory() if loop_factory else asyncio.new_event_loop()
    web.run_app(
        create_app(config),
        host=host or config.listener.host,
        port=config.listener.port if port is None else port,
        handler_cancellation=True,  # a caller that disconnects cancels its upstream request
        access_log=None,
        print=lambda msg: logging.getLogger("mcp_gateway").info(msg),
        loop=loop,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="Caching discovery gateway for MCP servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the gateway")
    p_serve.add_argument("--config", help="TOML config file (default: $MCP_GATEWAY_CONFIG)")
    p_serve.add_argument("--host", help="override listener.host")
    p_serve.add_argument("--port", type=int, help="override listener.port")
    p_serve.add_argument("--log-level", default=os.environ.get("MCP_GATEWAY_LOG_LEVEL", "info"))
    p_serve.add_argument(
        "--log-format", choices=("json", "text"), default=os.environ.get("MCP_GATEWAY_LOG_FORMAT", "json")
    )
    p_check = sub.add_parser("check-config", help="validate a config file (exit 0, or 2 naming the bad key)")
    p_check.add_argument("path")
    p_demo = sub.add_parser("demo", help="start a demo fleet of real MCP servers behind the gateway")
    p_demo.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    args = parser.parse_args(argv)

    if args.command == "check-config":
        config = _load(args.path)
        print(f"{args.path}: ok ({len(config.upstreams)} upstreams: {', '.join(config.upstreams) or 'none'})")
        return 0
    if args.command == "serve":
        setup_logging(args.log_level, args.log_format)
        serve(_load(_config_path(args.config)), host=args.host, port=args.port)
        return 0
    from .demo import run_demo

    return run_demo(gateway_port=args.port)


if __name__ == "__main__":
    sys.exit(main())
