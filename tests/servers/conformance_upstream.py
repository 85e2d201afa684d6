"""An MCP 2026-07-28 upstream built on the official SDK, shaped for the conformance suite.

Run as ``python tests/servers/conformance_upstream.py PORT``; the endpoint is
``http://127.0.0.1:PORT/mcp``. It exposes the diagnostic tools, prompts and resources that the
suite's scenarios look for (``test_missing_capability``, ``test_trigger_tool_change``,
``test://static-text`` ...), with public cache hints on discovery, every list and resources/read.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

from mcp.server import MCPServer
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, Elicit, ElicitationResult, Resolve, Sample
from mcp.server.mcpserver.prompts.base import Prompt
from mcp_types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import BaseModel

PUBLIC = CacheHint(ttl_ms=60_000, scope="public")

srv: MCPServer = MCPServer(
    "conformance-upstream",
    version="1.0.0",
    instructions="SDK upstream for the conformance-comparison tests.",
    cache_hints={
        "server/discover": PUBLIC,
        "tools/list": PUBLIC,
        "prompts/list": PUBLIC,
        "resources/list": PUBLIC,
        "resources/templates/list": PUBLIC,
        "resources/read": PUBLIC,
    },
)


# --- tools (the first listed tool must succeed with empty arguments: http-header-validation calls it)


@srv.tool()
def test_simple_text() -> str:
    """Return a fixed text response."""
    return "This is a simple text response for testing."


@srv.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _ask_model() -> Sample:
    """Ask the client's LLM for a sample, which needs the client's `sampling` capability."""
    question = SamplingMessage(role="user", content=TextContent(type="text", text="Say hello."))
    return Sample([question], max_tokens=16)


@srv.tool()
def test_missing_capability(answer: Annotated[CreateMessageResult, Resolve(_ask_model)]) -> str:
    """Need the client's sampling capability (answers -32021 when it is not declared)."""
    content = answer.content
    return content.text if isinstance(content, TextContent) else "sampled"


class _Name(BaseModel):
    """Form schema for the elicitation tool."""

    name: str


def _ask_name() -> Elicit[_Name]:
    """Ask the user for a name through form elicitation."""
    return Elicit("What is your name?", _Name)


@srv.tool()
def test_streaming_elicitation(outcome: Annotated[ElicitationResult[_Name], Resolve(_ask_name)]) -> str:
    """Ask the user for a name through an input_required result."""
    if outcome.action == "accept":
        return f"Hello, {outcome.data.name}!"
    return f"Elicitation {outcome.action}"


@srv.tool()
async def test_logging_tool(ctx: Context) -> str:
    """Emit log messages; the SDK drops them unless the request set a log level."""
    await ctx.info("logging tool started")
    await ctx.info("logging tool finished")
    return "logged"


def dynamic_tool() -> str:
    """Exist only between two calls of test_trigger_tool_change."""
    return "dynamic"


def dynamic_prompt() -> str:
    """Exist only between two calls of test_trigger_prompt_change."""
    return "This prompt appears and disappears."


_dynamic = {"tool": False, "prompt": False}


@srv.tool()
async def test_trigger_tool_change(ctx: Context) -> str:
    """Add or remove `dynamic_tool`, then notify tools list-changed listeners."""
    if _dynamic["tool"]:
        srv.remove_tool("dynamic_tool")
    else:
        srv.add_tool(dynamic_tool, name="dynamic_tool", description="A tool toggled at run time.")
    _dynamic["tool"] = not _dynamic["tool"]
    await ctx.notify_tools_changed()
    return "tools changed"


@srv.tool()
async def test_trigger_prompt_change(ctx: Context) -> str:
    """Add or remove `dynamic_prompt`, then notify prompts list-changed listeners."""
    if _dynamic["prompt"]:
        srv.remove_prompt("dynamic_prompt")
    else:
        srv.add_prompt(Prompt.from_function(dynamic_prompt, description="A prompt toggled at run time."))
    _dynamic["prompt"] = not _dynamic["prompt"]
    await ctx.notify_prompts_changed()
    return "prompts changed"


# --- prompts


@srv.prompt()
def test_simple_prompt() -> str:
    """A prompt without arguments."""
    return "This is a simple prompt for testing."


@srv.prompt()
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    """A prompt with two required arguments."""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


# --- resources


@srv.resource("test://static-text", name="static-text", description="A static text resource.", mime_type="text/plain")
def static_text() -> str:
    """Return the static text resource."""
    return "This is the content of the static text resource."


@srv.resource(
    "test://template/{item_id}/data",
    name="template-data",
    description="A resource template keyed by id.",
    mime_type="application/json",
)
def template_data(item_id: str) -> str:
    """Return JSON data for one id."""
    body = {"id": item_id, "templateTest": True, "data": f"Data for ID: {item_id}"}
    return json.dumps(body, separators=(",", ":"))


def main() -> None:
    """Serve streamable HTTP on 127.0.0.1:PORT (PORT is argv[1])."""
    srv.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))


if __name__ == "__main__":
    main()
