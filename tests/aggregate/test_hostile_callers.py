"""``POST /mcp`` against a hostile caller: bodies that are odd but JSON (white space, escaped
keys, big numbers, lone surrogates, nesting thousands deep), ``params`` of the wrong shape,
completion refs that name nothing, and requests without the token when ``[auth]`` is on.

What must hold: a call reaches its member byte for byte but for the tool's name; arguments nested
thousands deep are answered as on the member's own route (200, or 400 where parsing gives up),
never a 500; ``params`` of the wrong shape (a 4xx) and completion refs of the wrong shape or
naming nothing (-32602) carry the caller's id, are never a 500 and reach no member; with
``[auth]`` every request is a 401 before anything else is looked at, and the 401 tells nothing of
the members.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from ..support import StartGateway, StartUpstream, mcp_headers
from .conftest import agg, agg_url, aggregate_config, body_of, post
from .scripted import META, member

pytestmark = pytest.mark.timeout(60)


def raw_call(name: str, *, arguments: str = "{}", request_id: str = '"c1"') -> bytes:
    """A compact ``tools/call`` body with ``arguments`` as raw JSON text."""
    return (
        f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":'
        f'{{"name":{json.dumps(name)},"arguments":{arguments},"_meta":{META}}}}}'
    ).encode()


@pytest.mark.parametrize(
    "template",
    [
        # white space everywhere, the name key in nested objects, a big integer, a lone surrogate
        ' \r\n{ "jsonrpc" : "2.0" ,\t"id" : 12345678901234567890123 , "method" : "tools/call" , "params" :'
        ' { "arguments" : { "name" : "a__t" , "n" : 123456789012345678901234567890 , "s" : "\\ud800" ,'
        ' "deep" : [[[{"name": "a__t"}]]] } , "name" \n: NAME , "_meta" : ' + META + " } } \n",
        # the name key spelled with escapes, last; the method too
        '{"jsonrpc":"2.0","id":"x","meth\\u006fd":"tools/call","params":{"_meta":'
        + META
        + ',"arguments":{},"na\\u006de":NAME}}',
        # params first, id last
        '{"params":{"name":NAME,"_meta":' + META + '},"method":"tools/call","jsonrpc":"2.0","id":-1}',
    ],
    ids=["whitespace", "escaped-keys", "params-first"],
)
@pytest.mark.parametrize("spelled", ['"a__t"', '"a__\\u0074"', '"\\u0061__t"'])
async def test_a_call_body_reaches_the_member_byte_for_byte_but_the_name(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, template: str, spelled: str
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}))
    body = template.replace("NAME", spelled).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/call", "a__t"))
    assert reply.status == 200, reply.raw
    assert up.requests[-1].body == template.replace("NAME", '"t"').encode()
    assert up.requests[-1].headers["Mcp-Name"] == "t"


@pytest.mark.parametrize("depth", [*range(900, 1000, 10), 5000])
async def test_deeply_nested_call_arguments_are_never_a_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, depth: int
) -> None:
    # Parsing gives up (-32700) before rewriting the body could (gateway/aggregate/rewrite.py walks
    # it with the standard library's decoder); below that the call goes through.
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}))
    arguments = '{"x":' + "[" * depth + "]" * depth + "}"
    reply = await post(http, agg_url(gw), raw_call("a__t", arguments=arguments), mcp_headers("tools/call", "a__t"))
    own = await post(http, gw.url("a"), raw_call("t", arguments=arguments), mcp_headers("tools/call", "t"))
    assert reply.status in (200, 400), reply.raw
    assert reply.status == own.status


@pytest.mark.parametrize(
    "params",
    ["[]", "null", "5", '"a__t"', '{"arguments":{"name":"a__t"},"_meta":' + META + "}"],
)
async def test_a_call_whose_params_are_odd_is_a_4xx_never_a_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, params: str
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}))
    body = f'{{"jsonrpc":"2.0","id":"p","method":"tools/call","params":{params}}}'.encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/call", "a__t"))
    assert 400 <= reply.status < 500, reply.raw
    assert reply.json["id"] == "p" and not up.requests


@pytest.mark.parametrize(
    "ref",
    [
        None,
        "a__greet",
        ["a__greet"],
        {},
        {"type": "ref/prompt"},
        {"type": "ref/prompt", "name": 5},
        {"type": "ref/resource", "name": "a__greet"},
        {"type": "ref/resource", "uri": 5},
        {"type": "ref/prompt", "name": "greet"},
        {"type": "ref/prompt", "name": "zz__greet"},
    ],
    ids=repr,
)
async def test_completion_with_an_odd_ref_is_32602_never_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, ref: Any
) -> None:
    up = await start_upstream()
    gw = await start_gateway(aggregate_config({"a": up.url}))
    params: dict[str, Any] = {"argument": {"name": "x", "value": ""}}
    if ref is not None:
        params["ref"] = ref
    reply = await agg(http, gw, "completion/complete", params, id="c")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (400, -32602, "c"), reply.raw
    assert not up.requests


TOKEN = "attack-tests-token-0123456789"


@pytest.mark.parametrize(
    ("method", "params", "body"),
    [
        ("tools/list", {}, None),
        ("tools/list", {"cursor": "forged"}, None),
        ("server/discover", {}, None),
        ("tools/call", {"name": "a__t", "arguments": {}}, None),
        ("tools/call", {"name": "zz__nothing", "arguments": {}}, None),
        ("resources/read", {"uri": "mcp-gateway:a/res://x"}, None),
        ("prompts/get", {"name": "a__p"}, None),
        ("completion/complete", {"ref": {"type": "ref/prompt", "name": "a__p"}, "argument": {}}, None),
        ("subscriptions/listen", {"notifications": {"toolsListChanged": True}}, None),
        ("ping", {}, None),
        ("tools/list", {}, b"{not json"),
        ("tools/list", {}, b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}'),
        ("tools/call", {}, b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'),
    ],
)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-0123456789", "Basic " + TOKEN, TOKEN])
async def test_with_auth_every_mcp_request_needs_the_token_first(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    method: str,
    params: dict[str, Any],
    body: bytes | None,
    authorization: str | None,
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}, auth={"tokens": [TOKEN]}))
    headers = mcp_headers(method, params.get("name") or params.get("uri"))
    if authorization is not None:
        headers["Authorization"] = authorization
    data = body if body is not None else json.dumps(body_of(method, params)).encode()
    reply = await post(http, agg_url(gw), data, headers)
    assert reply.status == 401, reply.raw
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert reply.error["code"] == -32600
    assert b"a__" not in reply.raw and b"member" not in reply.raw and b"mcp-gateway:" not in reply.raw
    assert not up.requests
