"""Upstream MCP server (official SDK, low-level ``Server``) whose lists come in several pages.

Usage: python tests/servers/paged_upstream.py PORT   -> http://127.0.0.1:PORT/mcp

``tools/list`` answers 8 tools, ``paged_1`` .. ``paged_8``, in 3 pages of 3, 3 and 2 (the SDK lets
a low-level handler read ``params.cursor`` and set ``next_cursor``): no cursor -> page 1 and
``nextCursor: "page-2"``; ``"page-2"`` -> page 2 and ``"page-3"``; ``"page-3"`` -> page 3 and no
``nextCursor``; any other cursor -> JSON-RPC error -32602. ``prompts/list`` is paged the same way
(``paged_prompt_1`` .. ``paged_prompt_5``: pages of 2, 2, 1). Every tool and prompt carries a
distinct description and the tools an ``inputSchema`` with one property, so that a composed list
can be compared item by item. ``tools/call`` of ``paged_N`` answers the text ``"paged_N called"``.

Cache hints: public, ttlMs = $UPSTREAM_TTL_MS (default 60000), on server/discover, tools/list and
prompts/list. Test endpoints: GET /_counts, POST /_counts/reset, GET /_requests (see _common.py).
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
import uvicorn
from _common import HOST, MCP_PATH, Recorder, port_from_argv, ttl_ms_from_env
from mcp.server.caching import CacheHint
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

TOOL_PAGES: list[list[str]] = [
    ["paged_1", "paged_2", "paged_3"],
    ["paged_4", "paged_5", "paged_6"],
    ["paged_7", "paged_8"],
]
PROMPT_PAGES: list[list[str]] = [
    ["paged_prompt_1", "paged_prompt_2"],
    ["paged_prompt_3", "paged_prompt_4"],
    ["paged_prompt_5"],
]
CURSORS = [None, "page-2", "page-3"]


def page_of(cursor: str | None, pages: list[list[str]]) -> tuple[list[str], str | None]:
    if cursor not in CURSORS:
        raise MCPError(INVALID_PARAMS, f"unknown cursor {cursor!r}")
    index = CURSORS.index(cursor)
    return pages[index], CURSORS[index + 1] if index + 1 < len(pages) else None


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    names, next_cursor = page_of(params.cursor if params is not None else None, TOOL_PAGES)
    tools = [
        types.Tool(
            name=name,
            description=f"Tool {name} of the paged upstream.",
            input_schema={"type": "object", "properties": {f"arg_{name}": {"type": "string"}}},
        )
        for name in names
    ]
    return types.ListToolsResult(tools=tools, next_cursor=next_cursor)


async def list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
    names, next_cursor = page_of(params.cursor if params is not None else None, PROMPT_PAGES)
    prompts = [types.Prompt(name=name, description=f"Prompt {name} of the paged upstream.") for name in names]
    return types.ListPromptsResult(prompts=prompts, next_cursor=next_cursor)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"{params.name} called")])


def main() -> None:
    hint = CacheHint(ttl_ms=ttl_ms_from_env(), scope="public")
    srv: Server[Any] = Server(
        "paged-upstream",
        version="1.0.0",
        instructions="Test upstream whose tools/list and prompts/list are paged.",
        cache_hints={"server/discover": hint, "tools/list": hint, "prompts/list": hint},
        on_list_tools=list_tools,
        on_list_prompts=list_prompts,
        on_call_tool=call_tool,
    )
    app = Recorder(srv.streamable_http_app(streamable_http_path=MCP_PATH, host=HOST))
    uvicorn.run(app, host=HOST, port=port_from_argv(), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
