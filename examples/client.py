"""List the tools of one upstream through the gateway, then call the demo's weather tool.

Usage (with `make demo` running):

    .venv/bin/python examples/client.py [URL] [CITY]

URL defaults to http://127.0.0.1:8080/servers/weather/mcp, CITY to Lisbon. The client is
the official `mcp` Python SDK (installed in .venv by `make demo` or `make test`). It speaks
MCP 2026-07-28 and keeps no cache of its own (`cache=None`), so every list request reaches
the gateway, which answers it from its cache.
"""

from __future__ import annotations

import asyncio
import json
import sys

from mcp import Client, MCPError

DEFAULT_URL = "http://127.0.0.1:8080/servers/weather/mcp"
PROTOCOL_VERSION = "2026-07-28"


async def main(url: str, city: str) -> int:
    async with Client(url, mode=PROTOCOL_VERSION, cache=None) as client:
        listing = await client.list_tools()
        print(f"{len(listing.tools)} tools at {url}:")
        for tool in listing.tools:
            print(f"  {tool.name}: {tool.description or ''}".rstrip())
        if not any(tool.name == "get_forecast" for tool in listing.tools):
            print("no get_forecast tool here: point the script at the demo's weather upstream", file=sys.stderr)
            return 1
        result = await client.call_tool("get_forecast", {"city": city, "days": 2})
        if result.is_error:
            print(f"get_forecast failed: {result.content}", file=sys.stderr)
            return 1
        print(f"get_forecast(city={city!r}, days=2):")
        print(json.dumps(result.structured_content, indent=2))
    return 0


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions inside ``group`` and the groups nested in it."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def run(argv: list[str]) -> int:
    """Run :func:`main`; an error the gateway or the upstream answered, or a failed
    connection, is printed as one line (the SDK raises them inside exception groups)."""
    url = argv[0] if argv else DEFAULT_URL
    city = argv[1] if len(argv) > 1 else "Lisbon"
    try:
        return asyncio.run(main(url, city))
    except* MCPError as group:
        for exc in _leaves(group):
            assert isinstance(exc, MCPError)
            print(f"{url}: JSON-RPC error {exc.code}: {exc.message}", file=sys.stderr)
    except* Exception as group:
        for exc in _leaves(group):
            print(f"{url}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
