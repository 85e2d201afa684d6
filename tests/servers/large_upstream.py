"""Upstream MCP server (official SDK) with one large public resource, for slow-caller tests.

Usage: python tests/servers/large_upstream.py PORT   -> http://127.0.0.1:PORT/mcp

Everything ``public_upstream.py`` serves (cacheable results public, ttlMs = $UPSTREAM_TTL_MS,
default 60000), plus ``res://large``: $UPSTREAM_LARGE_BYTES (default 3355443, 3.2 MiB) of text,
so that its ``resources/read`` answer is a cached hit of about that size.
"""

from __future__ import annotations

import os

from _common import port_from_argv, serve, ttl_ms_from_env
from _features import build_server

LARGE_BYTES = int(os.environ.get("UPSTREAM_LARGE_BYTES", "3355443"))

if __name__ == "__main__":
    srv = build_server("large-upstream", scope="public", ttl_ms=ttl_ms_from_env())

    @srv.resource("res://large", name="large", mime_type="text/plain")
    def large() -> str:
        return "x" * LARGE_BYTES

    serve(srv, port_from_argv())
