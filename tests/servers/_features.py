"""The feature set shared by the test upstreams (tools, resources, a template, a prompt)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from mcp.server import MCPServer
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, Elicit, Resolve
from mcp.server.subscriptions import SubscriptionBus
from pydantic import BaseModel, Field

CACHEABLE = (
    "server/discover",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
)

NON_ASCII_URI = "res://café"


class Confirmation(BaseModel):
    confirm: bool = Field(description="Proceed with the action?")


def ask_confirmation(action: str) -> Elicit[Confirmation]:
    # A resolver: on 2026-07-28 the SDK turns this into an `input_required` result (or -32021
    # when the request's client capabilities lack `elicitation`).
    return Elicit(f"Really {action}?", Confirmation)


def build_server(
    name: str,
    *,
    scope: Literal["public", "private"],
    ttl_ms: int,
    instructions: str | None = None,
    subscriptions: SubscriptionBus | None = None,
) -> MCPServer[Any]:
    hint = CacheHint(ttl_ms=ttl_ms, scope=scope)
    srv: MCPServer[Any] = MCPServer(
        name,
        version="1.0.0",
        instructions=instructions or f"Test upstream with {scope} cache hints (ttlMs={ttl_ms}).",
        cache_hints={m: hint for m in CACHEABLE},  # type: ignore[misc]
        subscriptions=subscriptions,
    )

    @srv.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @srv.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @srv.tool()
    async def slow_progress(ctx: Context, steps: int = 3, delay_ms: int = 50) -> str:
        """Report progress `steps` times (streams as SSE when the request has a progressToken)."""
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i}/{steps}")
            await anyio.sleep(delay_ms / 1000)
        return f"done after {steps} steps"

    @srv.tool()
    def confirm_action(action: str, confirmation: Annotated[Confirmation, Resolve(ask_confirmation)]) -> str:
        """Perform `action` after the user confirms it through form elicitation."""
        return f"{action}: {'confirmed' if confirmation.confirm else 'not confirmed'}"

    @srv.tool()
    def lookup(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], key: str) -> str:
        """Look up `key` in `region` (the region travels as the Mcp-Param-Region header too)."""
        return f"{region}:{key}"

    @srv.resource("res://hello", name="hello", mime_type="text/plain")
    def hello() -> str:
        return "hello world"

    @srv.resource(NON_ASCII_URI, name="cafe", mime_type="text/plain")
    def cafe() -> str:
        return "café ☕"

    @srv.resource("res://items/{item_id}", name="item", mime_type="text/plain")
    def item(item_id: str) -> str:
        return f"item {item_id}"

    @srv.prompt()
    def greet(name: str) -> str:
        """Greet someone by name."""
        return f"Hello, {name}!"

    return srv
