"""``POST /mcp`` against forged cursors: a real cursor of the gateway re-spelled, pointed past
the end, given to another list method, or spelled with JSON escapes in its key.

What must hold: a cursor the gateway did not give is -32602 (HTTP 400) with the caller's id,
never a 500 (MCP 2026-07-28, server/utilities/pagination, 'Error Handling'); the gateway's cursor
never reaches a member, whatever the spelling of its key, while every other member of ``params``
does, byte for byte.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp
import pytest

from gateway.app import STORE

from ..support import StartGateway, StartUpstream, mcp_headers
from .conftest import agg, agg_url, aggregate_config, names, post
from .scripted import META, member

pytestmark = pytest.mark.timeout(60)


def respelled(cursor: str, page: int | None = None, version: int | None = None, pad: bool = False) -> str:
    """``cursor`` (URL-safe base64) with its version byte (byte 0) or page number (bytes 1-4,
    big-endian) replaced, encoded again with or without ``=`` padding."""
    raw = bytearray(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    if page is not None:
        raw[1:5] = page.to_bytes(4, "big")
    if version is not None:
        raw[0] = version
    text = base64.urlsafe_b64encode(bytes(raw)).decode()
    return text if pad else text.rstrip("=")


@pytest.mark.parametrize(
    "forge",
    [
        lambda c: respelled(c, page=2**32 - 1),
        lambda c: respelled(c, page=3),  # just past the end
        lambda c: respelled(c, version=2),
        lambda c: respelled(c, pad=True),
        lambda c: base64.b64encode(base64.urlsafe_b64decode(c + "=" * (-len(c) % 4))).decode(),
        lambda c: c + "=",
        lambda c: c.upper(),
        lambda c: None,
        lambda c: "A" * 5000,  # a key over 4 KiB of params
        lambda c: c + "\u0000",
    ],
    ids=[
        "page-2^32-1",
        "page-past-end",
        "version",
        "padded",
        "std-b64",
        "trailing-=",
        "upper",
        "null",
        "5000-chars",
        "nul",
    ],
)
async def test_forged_spellings_of_a_real_cursor_are_32602_never_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, forge: Any
) -> None:
    up = await member(start_upstream, "t1", "t2", "t3")
    gw = await start_gateway(aggregate_config({"a": up.url}, {"page_size": 1}))
    cursor = (await agg(http, gw, "tools/list")).result["nextCursor"]
    forged = forge(cursor)
    reply = await agg(http, gw, "tools/list", {"cursor": forged}, id="f")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (400, -32602, "f"), (forged, reply.raw)
    for method in ("prompts/list", "resources/list", "resources/templates/list"):  # another list's method
        other = await agg(http, gw, method, {"cursor": cursor}, id="o")
        assert (other.status, other.error["code"]) == (400, -32602), (method, other.raw)


async def test_a_gateway_cursor_spelled_with_escapes_never_reaches_a_member(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # A list page after the first: each member gets the caller's body without the gateway's cursor
    # (whatever its key's spelling), every other member of params as sent.
    up = await member(start_upstream, "t1", "t2", "t3")
    gw = await start_gateway(aggregate_config({"a": up.url}, {"page_size": 1}))
    cursor = (await agg(http, gw, "tools/list")).result["nextCursor"]
    gw.app[STORE].purge(lambda key: True, "test")  # the members are asked again
    up.requests.clear()
    body = (
        '{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{ "curs\\u006fr" : '
        + json.dumps(cursor)
        + ' , "extra" : [1, 2] , "_meta" : '
        + META
        + " }}"
    ).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/list"))
    assert reply.status == 200 and names(reply.result) == ["a__t2"], reply.raw
    sent = json.loads(up.requests[-1].body)
    assert "cursor" not in sent["params"] and sent["params"]["extra"] == [1, 2]
    assert b"\\u006f" not in up.requests[-1].body and b'"extra" : [1, 2]' in up.requests[-1].body
