"""Upstream MCP server (official SDK) whose cacheable results are private.

Usage: python tests/servers/private_upstream.py PORT   -> http://127.0.0.1:PORT/mcp

Same tools/resources/template/prompt as public_upstream.py, but every cacheable result
(server/discover, tools/list, prompts/list, resources/list, resources/templates/list,
resources/read) carries cacheScope "private" and ttlMs = $UPSTREAM_TTL_MS (default 60000).
Test endpoints: GET /_counts, POST /_counts/reset, GET /_requests (see _common.py).
"""

from __future__ import annotations

from _common import port_from_argv, serve, ttl_ms_from_env
from _features import build_server

if __name__ == "__main__":
    serve(build_server("private-upstream", scope="private", ttl_ms=ttl_ms_from_env()), port_from_argv())
