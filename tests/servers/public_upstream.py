"""Upstream MCP server (official SDK) whose cacheable results are public.

Usage: python tests/servers/public_upstream.py PORT   -> http://127.0.0.1:PORT/mcp

Cache hints: ttlMs = $UPSTREAM_TTL_MS (default 60000), cacheScope "public" on server/discover,
tools/list, prompts/list, resources/list, resources/templates/list and resources/read.

Tools:     add(a, b), echo(text), slow_progress(steps=3, delay_ms=50) (reports progress),
           confirm_action(action) (form elicitation via MRTR / input_required),
           lookup(region, key) (`region` is an x-mcp-header param -> `Mcp-Param-Region`)
Resources: res://hello, res://café  (non-ASCII URI, sent verbatim)
Template:  res://items/{item_id}
Prompt:    greet(name)
Test endpoints: GET /_counts, POST /_counts/reset, GET /_requests (see _common.py).
"""

from __future__ import annotations

from _common import port_from_argv, serve, ttl_ms_from_env
from _features import build_server

if __name__ == "__main__":
    serve(build_server("public-upstream", scope="public", ttl_ms=ttl_ms_from_env()), port_from_argv())
