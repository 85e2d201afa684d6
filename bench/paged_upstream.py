"""Benchmark upstream for the memory figure: ~4 KB public ``tools/list`` pages, one per cursor.

Usage: python bench/paged_upstream.py PORT   -> http://127.0.0.1:PORT/mcp

A scripted aiohttp server (not an MCP SDK server: the SDK would take ~2 ms a page and has no
10,000 distinct pages). Every ``tools/list`` answers, for its ``params.cursor``, a page of 7
tools (about 4 KB of JSON) marked ``cacheScope:"public"``, ``ttlMs`` 3600000, with a
``nextCursor``. ``GET /_counts`` -> ``{"tools/list": N}``.
"""

from __future__ import annotations

import sys
from collections import Counter

import orjson
from aiohttp import web

TTL_MS = 3_600_000


def page(cursor: str) -> dict[str, object]:
    tools = []
    for i in range(7):
        name = f"{cursor}_tool_{i}"
        tools.append(
            {
                "name": name,
                "title": f"Tool {i} of page {cursor}",
                "description": (
                    f"Operation {i} of the {cursor} group: reads the matching records, applies the filters given, "
                    "and returns at most `limit` items ordered by update time, newest first."
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Full-text query over the records' fields."},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                        "cursor": {"type": ["string", "null"], "description": "Pagination cursor."},
                    },
                    "required": ["query"],
                },
                "annotations": {"readOnlyHint": True, "openWorldHint": False},
            }
        )
    return {
        "tools": tools,
        "nextCursor": f"{cursor}+",
        "resultType": "complete",
        "cacheScope": "public",
        "ttlMs": TTL_MS,
    }


def make_app() -> web.Application:
    counts: Counter[str] = Counter()

    async def mcp(request: web.Request) -> web.Response:
        msg = orjson.loads(await request.read())
        method = msg.get("method", "")
        counts[method] += 1
        params = msg.get("params") or {}
        if method != "tools/list":
            error = {"code": -32601, "message": f"method {method!r} not served by this benchmark upstream"}
            return web.json_response({"jsonrpc": "2.0", "id": msg.get("id"), "error": error}, dumps=_dumps)
        result = page(str(params.get("cursor", "first")))
        return web.Response(
            body=orjson.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "result": result}),
            content_type="application/json",
        )

    async def get_counts(request: web.Request) -> web.Response:
        return web.json_response(dict(counts))

    app = web.Application()
    app.router.add_post("/mcp", mcp)
    app.router.add_get("/_counts", get_counts)
    return app


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} PORT")
    web.run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
