"""``mcp-gateway demo``: two real MCP servers (official SDK) behind a local gateway.

:func:`run_demo` starts ``weather`` (public cache hints, ttl 60 s) and ``notes`` (private,
per-user data) as child processes on free 127.0.0.1 ports, runs the gateway in-process in front
of them, prints commands to try and stops everything on Ctrl-C or SIGTERM. ``servers`` holds the
two servers, ``run`` the demo itself; ``config/demo.toml`` shows the equivalent static config.
"""

from .run import DemoError, run_demo

__all__ = ["DemoError", "run_demo"]
