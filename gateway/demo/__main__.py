"""``python -m gateway.demo serve-upstream NAME PORT`` (how the demo starts its servers) or ``run``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .run import run_demo
from .servers import BUILDERS, serve_upstream


def _cli(argv: Sequence[str] | None = None) -> int:
    """``python -m gateway.demo serve-upstream NAME PORT`` (used by the demo) or ``run``."""
    parser = argparse.ArgumentParser(prog="python -m gateway.demo", description="The mcp-gateway demo.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("serve-upstream", help="serve one demo MCP server on 127.0.0.1:PORT/mcp")
    p_up.add_argument("name", choices=sorted(BUILDERS))
    p_up.add_argument("port", type=int)
    p_up.add_argument("--exit-on-stdin-eof", action="store_true", help="stop when stdin closes (parent gone)")
    p_run = sub.add_parser("run", help="the whole demo (same as: mcp-gateway demo)")
    p_run.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    args = parser.parse_args(argv)
    if args.command == "serve-upstream":
        serve_upstream(args.name, args.port, exit_on_stdin_eof=args.exit_on_stdin_eof)
        return 0
    return run_demo(gateway_port=args.port)


if __name__ == "__main__":
    sys.exit(_cli())
