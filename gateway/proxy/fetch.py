"""Reading one upstream answer whole: the JSON-RPC response to a request, from a JSON body or
from among the events of an SSE answer (MCP 2026-07-28, basic/transports/streamable-http,
'Receiving Messages': notifications may come first, then the response)."""

from __future__ import annotations

import asyncio
from typing import Any

from multidict import CIMultiDict

from ..codec import loads
from ..errors import BadGateway, GatewayTimeout
from ..jsonrpc import response_id_matches
from ..sse import SSEParser
from ..upstream import Upstream

__all__ = ["fetch_answer", "final_response"]


def final_response(events: list[bytes], request_id: object) -> tuple[dict[str, object] | None, int]:
    """The JSON-RPC response to ``request_id`` among SSE ``events``, with its size in bytes."""
    for data in events:
        try:
            message = loads(data)
        except ValueError:
            continue
        if response_id_matches(message, request_id):
            return message, len(data)
    return None, 0


async def fetch_answer(
    upstream: Upstream, body: bytes, headers: CIMultiDict[str], request_id: object
) -> tuple[int, Any, int]:
    """Send a refresh and read its JSON-RPC answer to ``request_id`` whole, JSON or SSE, within
    the upstream's ``timeout_s``: ``(HTTP status, the answer, its size in bytes)``.

    Raises:
        BadGateway, GatewayTimeout: the upstream failed, or gave no JSON-RPC answer to it.
    """
    timeout_s = upstream.config.timeout_s
    async with upstream.open("POST", body, headers) as resp:
        if resp.content_type == "text/event-stream":
            parser = SSEParser(upstream.config.max_response_bytes)
            try:
                async with asyncio.timeout(timeout_s):
                    async for chunk in upstream.iter_stream(resp):
                        message, size = final_response(parser.feed(chunk), request_id)
                        if message is not None:
                            return resp.status, message, size
                        if parser.overflowed:
                            break
            except TimeoutError:
                raise GatewayTimeout(f"upstream {upstream.name} did not answer within {timeout_s:g} s") from None
            message, size = final_response(parser.finish(), request_id)
            if message is not None:
                return resp.status, message, size
            raise BadGateway(f"upstream {upstream.name} ended the stream before answering")
        data = await upstream.read_body(resp, asyncio.get_running_loop().time() + timeout_s)
    try:
        message = loads(data)
    except ValueError:
        message = None
    if not response_id_matches(message, request_id):
        raise BadGateway(f"upstream {upstream.name} answered HTTP {resp.status} without a JSON-RPC response")
    return resp.status, message, len(data)
