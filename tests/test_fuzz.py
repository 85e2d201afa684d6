"""Fuzzing the gateway: whatever arrives, it answers with a forward or a JSON-RPC error, never a 500 or a hang.

Inputs (hypothesis): request bodies (arbitrary JSON, near-valid JSON-RPC objects, random ``_meta``
shapes, deep nesting and huge values within ``max_body_bytes``, invalid UTF-8, raw bytes), request
headers sent on a raw socket (the ``=?base64?…?=`` form, invalid base64, non-ASCII and non-UTF-8
bytes, mismatches, duplicates, odd spellings) and SSE framing from a scripted upstream (random splits,
``\\r\\n``/``\\n``/``\\r`` line endings, comments, garbage lines, interleaved notifications, partial
final events, final responses with matching or other ids).

The contract checked for every input (MCP 2026-07-28: Base Protocol, "Requests" and "Error codes";
Streamable HTTP, "Request metadata headers"):
status in the expected set; a gateway-made error is a JSON-RPC error object whose ``id`` echoes the
request's when it was readable; a forwarded answer carries the caller's id and the answer to the
caller's own params; forwarded header values are unchanged; SSE bytes are relayed as they came and
the caller always ends up with exactly one response to its request. Each request is bounded by
``REQUEST_TIMEOUT_S``.

Async hypothesis tests run every example on the test's event loop (pytest-asyncio), so one gateway
app and one scripted upstream serve all examples of a test function. Pure parsers (``parse_request``,
``decode_header_value``, ``SSEParser``) are fuzzed without a socket.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from gateway import codec, jsonrpc
from gateway.app import STORE, create_app
from gateway.config import parse_config
from gateway.errors import GatewayError
from gateway.protocol import ParsedRequest, decode_header_value, parse_request
from gateway.sse import SSEParser

from .support import (
    ACCEPT,
    CACHEABLE,
    CLIENT_CAPABILITIES_KEY,
    LEGACY_V,
    LEGACY_VERSIONS,
    NAME_FIELD,
    PROTOCOL_VERSION_KEY,
    SENTINEL_PREFIX,
    SENTINEL_SUFFIX,
    FakeUpstream,
    StartUpstream,
    V,
    header_value,
    list_result,
    rpc,
    sentinel,
    sse_events,
)

MAX_BODY = 64 * 1024
REQUEST_TIMEOUT_S = 5.0
METHODS = (*CACHEABLE, "tools/call", "prompts/get", "completion/complete", "subscriptions/listen")
#: Gateway-made rejections: HTTP status -> the JSON-RPC codes it may carry.
ERROR_CODES = {400: {-32700, -32600, -32602, -32020}, 413: {-32600}}

pytestmark = pytest.mark.timeout(120)

HTTP_SETTINGS = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
PURE_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- shared helpers ------------------------------------------------------------------------------------------


def is_valid_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def jdump(value: object) -> bytes:
    """Compact JSON for any value hypothesis makes (integers of any size included)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _no_constant(name: str) -> None:
    raise ValueError(name)


def spec_loads(body: bytes) -> object:
    """JSON as RFC 8259 reads it, from UTF-8 bytes (what a JSON-RPC body must be; a leading BOM may
    be ignored, RFC 8259 §8.1); raises ValueError."""
    try:
        return json.loads(body.removeprefix(b"\xef\xbb\xbf").decode("utf-8"), parse_constant=_no_constant)
    except RecursionError as exc:
        raise ValueError("too deep") from exc


def readable_id(body: bytes, max_body: int | None = MAX_BODY) -> object:
    """The request id a gateway error must echo: present when the body is one JSON object with a valid id
    (and, over HTTP, no larger than ``max_body``)."""
    if max_body is not None and len(body) > max_body:
        return None
    try:
        msg = spec_loads(body)
    except ValueError:
        return None
    if isinstance(msg, dict) and is_valid_id(msg.get("id")):
        return msg["id"]
    return None


def check_error_body(status: int, raw: bytes, expected_id: object) -> dict[str, Any]:
    """A gateway-made rejection: a JSON-RPC error object, the id echoed exactly when it was readable."""
    msg = json.loads(raw)
    assert isinstance(msg, dict) and msg.get("jsonrpc") == "2.0", raw
    err = msg.get("error")
    assert isinstance(err, dict) and isinstance(err.get("message"), str), raw
    assert err.get("code") in ERROR_CODES[status], (status, raw)
    if expected_id is None:
        assert "id" not in msg, raw
    else:
        assert msg["id"] == expected_id and type(msg["id"]) is type(expected_id), (expected_id, raw)
    assert set(msg) <= {"jsonrpc", "id", "error"}
    return msg


# -- 1. pure parsers (no socket) --------------------------------------------------------------------------------

#: Any JSON value: integers of any size, any text, nested in arrays and objects (up to hypothesis's
#: default of 100 leaves). The one definition every strategy below draws from.
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
)
ids = (
    st.integers(-(2**70), 2**70)
    | st.text(max_size=20)
    | st.sampled_from([None, True, False, 1.0, 0.5, [], {}, -0.0, 2**63, 2**64 - 1, 2**64])
)
meta_shapes = st.one_of(
    st.just({PROTOCOL_VERSION_KEY: V, CLIENT_CAPABILITIES_KEY: {}}),
    st.fixed_dictionaries(
        {},
        optional={
            PROTOCOL_VERSION_KEY: st.sampled_from([V, LEGACY_V, "2099-01-01", ""]) | json_scalars,
            CLIENT_CAPABILITIES_KEY: st.dictionaries(st.text(max_size=10), json_values, max_size=3) | json_values,
            "io.modelcontextprotocol/clientInfo": json_values,
            "progressToken": json_scalars,
            "traceparent": st.text(max_size=60),
            "io.modelcontextprotocol/logLevel": json_scalars,
        },
    ).flatmap(lambda m: st.dictionaries(st.text(max_size=15), json_values, max_size=3).map(lambda x: {**x, **m})),
    json_values,
)


@st.composite
def near_valid_messages(draw: st.DrawFn) -> object:
    """A valid modern request with a few of its parts replaced, removed or added."""
    method = draw(st.sampled_from(METHODS) | st.text(max_size=20))
    params: dict[str, Any] = {"_meta": draw(meta_shapes)}
    if method in NAME_FIELD:
        params[NAME_FIELD[method]] = draw(st.sampled_from(["add", "res://café", "a b", "=?base64?x?="]) | st.text())
    if draw(st.booleans()):
        params["cursor"] = draw(st.text(max_size=10) | json_scalars)
    for key in draw(st.lists(st.sampled_from(["inputResponses", "requestState", "arguments", "uri", "x"]), max_size=2)):
        params[key] = draw(json_values)
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(ids), "method": method, "params": params}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "extra"]))
        if draw(st.booleans()):
            msg.pop(key, None)
        else:
            msg[key] = draw(json_values | st.sampled_from(["2.0", "1.0", 2.0]))
    return draw(
        st.sampled_from([msg, [msg], [msg, msg], [], {"params": msg}]) if draw(st.integers(0, 9)) == 0 else st.just(msg)
    )


@st.composite
def deep_messages(draw: st.DrawFn) -> bytes:
    """A valid request whose ``cursor`` nests ``depth`` arrays or objects (orjson writes 254, reads 1024)."""
    depth = draw(st.integers(1, 1100) | st.sampled_from([253, 254, 255, 256, 1023, 1024, 1025]))
    method = draw(st.sampled_from(["tools/list", "tools/call"]))
    opener, closer = (b"[", b"]") if draw(st.booleans()) else (b'{"k":', b"}")
    marker = "deep-marker"
    msg = rpc(method, id_=draw(st.integers(0, 10)), cursor=marker)
    if method == "tools/call":
        msg["params"]["name"] = "add"
    return orjson.dumps(msg).replace(b'"deep-marker"', opener * depth + b'"x"' + closer * depth)


@st.composite
def huge_messages(draw: st.DrawFn) -> bytes:
    """A valid request padded to around ``MAX_BODY`` bytes (just under, at, or just over)."""
    base = orjson.dumps(rpc("tools/list", id_="big", cursor=""))
    size = MAX_BODY - len(base) + draw(st.integers(-64, 64))
    msg = rpc("tools/list", id_="big", cursor="x" * max(size, 0))
    return orjson.dumps(msg)


@st.composite
def invalid_utf8_messages(draw: st.DrawFn) -> bytes:
    """A valid request with bytes that are not UTF-8 spliced into one of its strings."""
    marker = "\u2603" * 3
    raw = orjson.dumps(rpc("tools/list", id_=draw(st.integers(0, 9)), cursor=marker))
    bad = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
    return raw.replace(marker.encode(), b"ok" + bad + b"ok")


bodies = st.one_of(
    json_values.map(jdump),
    near_valid_messages().map(jdump),
    deep_messages(),
    huge_messages(),
    invalid_utf8_messages(),
    st.binary(max_size=200),
)


def headers_for(body: bytes) -> dict[str, str]:
    """The request-metadata headers a correct client would send for ``body`` (so many inputs pass validation)."""
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": V, "Mcp-Method": "x"}
    try:
        msg = spec_loads(body)
    except ValueError:
        return headers
    if not isinstance(msg, dict):
        return headers
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(PROTOCOL_VERSION_KEY) if isinstance(meta, dict) else None
    if isinstance(version, str):
        headers["MCP-Protocol-Version"] = header_value(version)
    method = msg.get("method")
    if isinstance(method, str):
        headers["Mcp-Method"] = header_value(method)
        field_name = NAME_FIELD.get(method)
        if field_name is not None and isinstance(params, dict) and isinstance(params.get(field_name), str):
            headers["Mcp-Name"] = header_value(params[field_name])
    return headers


@PURE_SETTINGS
@given(body=bodies, drop=st.sets(st.sampled_from(["MCP-Protocol-Version", "Mcp-Method", "Mcp-Name"])))
@example(body=b'{"jsonrpc":"2.0","id":18446744073709551616,"method":"tools/list"}', drop=set())
@example(body=b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/list"}', drop=set())
@example(body=b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":1e400}}', drop=set())
def test_parse_request_returns_a_parsed_request_or_raises_a_gateway_error(body: bytes, drop: set[str]) -> None:
    headers = CIMultiDict(headers_for(body))
    for name in drop:
        headers.pop(name, None)
    try:
        parsed = parse_request(body, headers)
    except GatewayError as err:
        assert err.status == 400 and err.code in ERROR_CODES[400]
        check_error_body(400, err.body(), readable_id(body, None))
        return
    assert isinstance(parsed, ParsedRequest)
    assert parsed.kind in ("request", "notification", "response")
    if parsed.cache_bypass is None:  # a cacheable request is one the gateway fully validated
        assert parsed.kind == "request" and parsed.era == "modern" and parsed.method in CACHEABLE


envelope_members = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0"]) | json_values,
        "id": st.sampled_from([1, 7, "a"]) | json_values,
        "result": json_values,
        "error": st.fixed_dictionaries({"code": json_values, "message": st.text(max_size=5)}) | json_values,
    },
)


@given(
    members=st.lists(st.tuples(st.sampled_from(["jsonrpc", "id", "result", "error", "x"]), json_values), max_size=5)
    | envelope_members.map(lambda d: list(d.items())),
    request_id=st.sampled_from([1, 7, "a", 2**64, -(2**63) - 1]),
    pad=st.booleans(),
    simdjson=st.booleans(),
)
@example(members=[("jsonrpc", "2.0"), ("id", 7), ("id", 1), ("result", {})], request_id=1, pad=True, simdjson=True)
@example(
    members=[("jsonrpc", "2.0"), ("id", 1), ("result", {}), ("error", {"code": 3})],
    request_id=1,
    pad=True,
    simdjson=True,
)
@example(members=[("jsonrpc", "2.0"), ("id", 2**64), ("result", [])], request_id=2**64, pad=True, simdjson=True)
@example(members=[("jsonrpc", "2.0"), ("id", 1), ("error", {"code": 2**70})], request_id=1, pad=True, simdjson=True)
@settings(max_examples=1500, deadline=None)
def test_a_relayed_answer_is_judged_as_the_exact_parse_judges_it(
    members: list[tuple[str, Any]], request_id: object, pad: bool, simdjson: bool
) -> None:
    """loads_relayed (simdjson envelope or orjson alone) reaches the proxy's decisions of the
    exact parse: whether it answers the request, and the logged error code (within 64 bits)."""
    if pad:  # over ENVELOPE_MIN_BYTES, so that simdjson, when installed, is used
        members = [*members, ("padding", "p" * codec.ENVELOPE_MIN_BYTES)]
    # Duplicate members are written as they are (json.dumps of pairs would keep the last).
    data = ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}").encode()
    with pytest.MonkeyPatch.context() as patch:
        if not simdjson:
            patch.setattr(codec, "_ENVELOPE_PARSER", None)
        relayed = codec.loads_relayed(data, request_id)
    exact = codec.loads(data)
    assert jsonrpc.response_id_matches(relayed, request_id) == jsonrpc.response_id_matches(exact, request_id)

    def code(message: Any) -> object:
        error = message.get("error") if isinstance(message, dict) else None
        value = error.get("code") if isinstance(error, dict) else None
        return value if type(value) is int and -(2**63) <= value < 2**64 else None

    assert code(relayed) == code(exact)


@pytest.mark.parametrize("size", [100, 4096, 300_000])
def test_relayed_answers_of_any_size_are_judged(size: int) -> None:
    """Small ones and those over ENVELOPE_MAX_BYTES go to orjson, the others (with simdjson) to
    the envelope check: the same decisions."""
    assert codec.ENVELOPE_MIN_BYTES < 4096 < codec.ENVELOPE_MAX_BYTES < 300_000
    result = {"tools": [], "padding": "p" * size}
    ok = orjson.dumps({"jsonrpc": "2.0", "id": 3, "result": result})
    other = orjson.dumps({"jsonrpc": "2.0", "id": 4, "result": result})
    assert jsonrpc.response_id_matches(codec.loads_relayed(ok, 3), 3)
    assert not jsonrpc.response_id_matches(codec.loads_relayed(other, 3), 3)
    assert not jsonrpc.response_id_matches(codec.loads_relayed(ok, "3"), "3")


@PURE_SETTINGS
@given(value=st.text())
@example(value="")
@example(value="=?base64?YWRk?=")
def test_header_sentinel_round_trips_any_text(value: str) -> None:
    assert decode_header_value(sentinel(value)) == value
    assert decode_header_value(header_value(value)) == value


@PURE_SETTINGS
@given(raw=st.text() | st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")))
@example(raw="=?base64?not base64!?=")
@example(raw="=?base64?/w==?=")  # valid base64 of a byte that is not UTF-8
@example(raw="=?base64?=")
@example(raw="caf\udcc3\udca9")  # what aiohttp makes of raw UTF-8 bytes in a header
def test_decode_header_value_never_raises(raw: str) -> None:
    decoded = decode_header_value(raw)
    assert decoded is None or isinstance(decoded, str)
    if decoded is not None and not raw.startswith("=?base64?"):
        assert decoded == raw and all(" " <= ch <= "~" or ch == "\t" for ch in raw)


sse_lines = st.lists(
    st.one_of(
        st.binary(max_size=30).filter(lambda b: b"\r" not in b and b"\n" not in b),
        st.sampled_from([b"data: {}", b"data:x", b"data", b":", b": ping", b"event: message", b"id: 7", b"retry: 5"]),
        st.just(b""),
    ),
    max_size=15,
)


@PURE_SETTINGS
@given(
    lines=sse_lines,
    endings=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 400), max_size=6),
)
@example(lines=[b"data: 1", b""], endings=[b"\r\n"], cuts=[8])  # CR and LF of one CRLF in two chunks
@example(lines=[b"data: 1", b""], endings=[b"\r"], cuts=[8])
def test_sse_parser_events_do_not_depend_on_chunk_boundaries(
    lines: list[bytes], endings: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(line + endings[i % len(endings)] for i, line in enumerate(lines))
    whole = SSEParser(1 << 20).feed(stream)
    parser = SSEParser(1 << 20)
    chunked: list[bytes] = []
    last = 0
    for cut in [*sorted({min(c, len(stream)) for c in cuts}), len(stream)]:
        chunked += parser.feed(stream[last:cut])
        last = cut
    assert chunked == whole
    # The events seen before EOF are the reference's, minus one a final lone CR would complete.
    assert whole == sse_events(stream, at_eof=False)


# -- 2. the HTTP route, one app per test ---------------------------------------------------------------------------


async def echo(request: web.Request, msg: Any) -> web.StreamResponse:
    """The upstream's answer to a request: a result that echoes its method, params (without
    ``_meta``) and clientCapabilities (public and cacheable for the cacheable methods); 202 for
    notifications and client responses, 400 for a body that is not JSON."""
    if msg is None:
        return web.Response(status=400)
    if not isinstance(msg, dict) or "id" not in msg or "method" not in msg:
        return web.Response(status=202)
    params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    result = {
        "method": msg["method"],
        "echo": {k: v for k, v in params.items() if k != "_meta"},
        "caps": meta.get(CLIENT_CAPABILITIES_KEY),
        "resultType": "complete",
        "cacheScope": "public",
        "ttlMs": 600_000,
    }
    answer = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}, separators=(",", ":"))
    return web.Response(body=answer.encode(), content_type="application/json")


@dataclass
class Env:
    client: TestClient[Any, Any]
    server: TestServer
    app: web.Application
    upstream: FakeUpstream


@pytest.fixture
async def env(aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream) -> Env:
    """One gateway in front of one upstream answering with :func:`echo`, for every example of a test
    (a test that scripts other answers sets ``upstream.answer`` and puts :func:`echo` back)."""
    upstream = await start_upstream(echo)
    cfg = {
        "listener": {"max_body_bytes": MAX_BODY},
        "registry": {"enabled": False},  # the properties look at every request the upstream sees
        "upstreams": {"up": {"url": upstream.url}},
    }
    server: TestServer = await aiohttp_server(create_app(parse_config(cfg, env={})))
    client = await aiohttp_client(server)
    return Env(client, server, server.app, upstream)


@HTTP_SETTINGS
@given(body=bodies, keep_headers=st.booleans())
@example(body=b"", keep_headers=True)
@example(body=b"\xff\xfe", keep_headers=True)
@example(body=jdump(rpc("tools/list", id_=2**63)), keep_headers=True)
@example(body=jdump(rpc("tools/list", id_=-(2**63) - 1)), keep_headers=True)
@example(body=jdump(rpc("tools/list", id_=2**70)), keep_headers=True)
@example(body=b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/list"}', keep_headers=True)
@example(body=jdump(rpc("tools/list", cursor=1)), keep_headers=True)
@example(body=jdump(rpc("tools/list", cursor=True)), keep_headers=True)  # must not hit the entry for 1
@example(body=b'{"jsonrpc":"2.0","id":1,"result":{}}', keep_headers=True)
async def test_any_body_gets_a_forward_or_a_jsonrpc_error(env: Env, body: bytes, keep_headers: bool) -> None:
    headers = headers_for(body) if keep_headers else {"Content-Type": "application/json"}
    before = len(env.upstream.requests)

    async def send() -> tuple[int, str, bytes, str | None]:
        async with env.client.post("/servers/up/mcp", data=body, headers=headers) as resp:
            return resp.status, resp.content_type, await resp.read(), resp.headers.get("Cache-Status")

    status, _, raw, cache_status = await asyncio.wait_for(send(), REQUEST_TIMEOUT_S)
    event(f"HTTP {status}" + (" (hit)" if cache_status and "hit" in cache_status else ""))
    assert cache_status is not None and cache_status.startswith("mcp-gateway")
    expected_id = readable_id(body)
    if status in ERROR_CODES:
        check_error_body(status, raw, expected_id)
        assert len(env.upstream.requests) == before  # rejected inputs never reach the upstream
        return
    assert status in (200, 202), (status, raw)
    msg = spec_loads(body)
    assert isinstance(msg, dict)
    if status == 202:
        assert raw == b"" and ("id" not in msg or "method" not in msg)
        return
    answer = json.loads(raw)
    assert answer["id"] == expected_id and type(answer["id"]) is type(expected_id)
    # The answer (fresh or from the cache) is the answer to this request's own method and params,
    # compared as canonical JSON (so 1, 1.0 and true stay apart).
    params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    assert answer["result"]["method"] == msg["method"]
    assert canonical(answer["result"]["echo"]) == canonical({k: v for k, v in params.items() if k != "_meta"})
    assert canonical(answer["result"]["caps"]) == canonical(meta.get(CLIENT_CAPABILITIES_KEY))


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# -- request headers, on a raw socket (duplicates, bytes that are not UTF-8, odd spellings) -------------------------


async def raw_post(
    port: int, header_lines: list[tuple[bytes, bytes]], body: bytes
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP/1.1 POST to /servers/up/mcp with exactly these header lines; returns status, headers, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = b"POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += b"".join(name + b": " + value + b"\r\n" for name, value in header_lines)
        head += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        writer.write(head + body)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}
    if headers.get(b"transfer-encoding") == b"chunked":
        out = b""
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        rest = out
    return int(status_line.split()[1]), headers, rest


def spec_decode(value: bytes) -> str | None:
    """Independent reading of SEP-2243 value encoding: plain visible ASCII, or the base64 sentinel."""
    if value.startswith(SENTINEL_PREFIX) and value.endswith(SENTINEL_SUFFIX):
        try:
            return base64.b64decode(value[len(SENTINEL_PREFIX) : -len(SENTINEL_SUFFIX)], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
    if all(0x20 <= b <= 0x7E or b == 0x09 for b in value):
        return value.decode()
    return None


names = st.sampled_from(
    ["add", "greet", "a b", "res://hello", "res://café", "日本", "=?base64?x?=", "x" * 200]
) | st.text(min_size=1, max_size=12)
visible = st.binary(max_size=20).map(lambda b: bytes(c for c in b if 0x21 <= c <= 0x7E))
obs_text = st.binary(min_size=1, max_size=12).map(lambda b: bytes(c | 0x80 for c in b))


@st.composite
def header_values(draw: st.DrawFn, correct: str) -> tuple[str, bytes]:
    """(kind, value) for a header whose correct decoded value is ``correct``."""
    kind = draw(
        st.sampled_from(
            [
                "plain",
                "sentinel",
                "sentinel-other",
                "sentinel-bad-base64",
                "sentinel-upper",
                "utf8",
                "obs-text",
                "other",
            ]
        )
    )
    raw = correct.encode()
    b64 = base64.b64encode(raw)
    value = {
        "plain": raw,
        "sentinel": SENTINEL_PREFIX + b64 + SENTINEL_SUFFIX,
        "sentinel-other": SENTINEL_PREFIX + base64.b64encode(raw + b"x") + SENTINEL_SUFFIX,
        "sentinel-bad-base64": SENTINEL_PREFIX
        + draw(st.sampled_from([b64.rstrip(b"="), b64 + b"!", b"*" + b64, b"===="]))
        + SENTINEL_SUFFIX,
        "sentinel-upper": b"=?BASE64?" + b64 + SENTINEL_SUFFIX,
        "utf8": raw,
        "obs-text": draw(obs_text),
        "other": draw(visible),
    }[kind]
    if any((b < 0x20 and b != 0x09) or b == 0x7F for b in value):
        kind, value = "sentinel", SENTINEL_PREFIX + b64 + SENTINEL_SUFFIX  # a raw CR/LF/NUL is not HTTP
    return kind, value


@dataclass(frozen=True)
class HeaderCase:
    method: str
    name: str | None
    lines: tuple[tuple[bytes, bytes], ...]


@st.composite
def header_cases(draw: st.DrawFn) -> HeaderCase:
    method = draw(st.sampled_from(["tools/list", "tools/call", "prompts/get", "resources/read", "resources/list"]))
    name = draw(names) if method in NAME_FIELD else None
    lines: list[tuple[bytes, bytes]] = [(b"Content-Type", b"application/json"), (b"Accept", ACCEPT.encode())]

    def spell(canonical: bytes) -> bytes:
        return draw(st.sampled_from([canonical, canonical.lower(), canonical.upper()]))

    for canonical, correct in (
        (b"MCP-Protocol-Version", V),
        (b"Mcp-Method", method),
        (b"Mcp-Name", name if name is not None else draw(names)),
    ):
        present = draw(st.integers(0, 9)) > 0 if canonical != b"Mcp-Name" or name is not None else draw(st.booleans())
        if not present:
            continue
        # What a correct client sends: the plain value, or the sentinel when it is not visible ASCII.
        wire = correct.encode() if spec_decode(correct.encode()) is not None else header_value(correct).encode()
        value = draw(header_values(correct))[1] if draw(st.integers(0, 2)) == 0 else wire
        if canonical == b"MCP-Protocol-Version" and draw(st.integers(0, 5)) == 0:
            value = draw(st.sampled_from([b"2099-01-01", *(v.encode() for v in LEGACY_VERSIONS), b"2026-07-28 "]))
        lines.append((spell(canonical), value))
        if draw(st.integers(0, 5)) == 0:  # a duplicate, equal or not
            lines.append((spell(canonical), draw(st.sampled_from([value, wire, b"other", b""]))))
    for _ in range(draw(st.integers(0, 2))):
        param = b"Mcp-Param-" + draw(st.sampled_from([b"Region", b"X", b"a-b"]))
        lines.append(
            (spell(param), draw(visible | obs_text | st.just("café".encode()) | st.just(sentinel("日本").encode())))
        )
    if draw(st.integers(0, 7)) == 0:
        lines.append((b"Mcp-Session-Id", b"s-1"))
    if draw(st.integers(0, 5)) == 0:
        lines.append((spell(b"Authorization"), b"Bearer " + draw(visible)))
    order = draw(st.permutations(range(len(lines))))
    return HeaderCase(method, name, tuple(lines[i] for i in order))


#: Request headers the gateway passes upstream as they are (MCP 2026-07-28,
#: basic/transports/streamable-http, 'Request Metadata': the routing headers reach the server;
#: trace context too), besides every ``Mcp-Param-*``.
FORWARDED_HEADERS = frozenset(
    h.lower().encode()
    for h in (
        "MCP-Protocol-Version",
        "Mcp-Method",
        "Mcp-Name",
        "Accept",
        "Content-Type",
        "Mcp-Session-Id",
        "Last-Event-ID",
        "traceparent",
        "tracestate",
        "baggage",
    )
)


def expected_outcome(case: HeaderCase) -> int:
    """200 (forwarded) or -32020 by an independent reading of the header rules (Streamable HTTP,
    "Request metadata headers"); a header sent twice with different values is a mismatch."""

    def values(canonical: str) -> list[bytes]:
        return [v.strip(b" \t") for k, v in case.lines if k.lower() == canonical.lower().encode()]

    def single(canonical: str) -> bytes | None:
        vals = values(canonical)
        if not vals:
            return None
        if len(set(vals)) > 1:
            return b"\x00conflict"
        return vals[0]

    for name, value in case.lines:
        low = name.lower()
        if low in FORWARDED_HEADERS or low.startswith(b"mcp-param-"):
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                return -32020  # could not be forwarded unchanged, on any path
            if any((ord(c) < 0x20 and c != "\t") or c == "\x7f" for c in text):
                return -32020

    version = single("MCP-Protocol-Version")
    if version == b"\x00conflict":
        return -32020  # two versions: neither era can be told, on any path
    if (version is not None and version.decode(errors="replace") in LEGACY_VERSIONS) or values("Mcp-Session-Id"):
        return 200  # legacy era: passed through as it is
    if version != V.encode():
        return -32020
    if single("Mcp-Method") != case.method.encode():
        return -32020
    if case.method in NAME_FIELD:
        raw = single("Mcp-Name")
        if raw is None or spec_decode(raw) != case.name:
            return -32020
    return 200


@HTTP_SETTINGS
@given(case=header_cases())
@example(
    case=HeaderCase(
        "tools/call",
        "add",
        ((b"MCP-Protocol-Version", V.encode()), (b"Mcp-Method", b"tools/call"), (b"Mcp-Name", b"=?base64?YWRk?=")),
    )
)
@example(
    case=HeaderCase(
        "resources/read",
        "res://café",
        (
            (b"MCP-Protocol-Version", V.encode()),
            (b"Mcp-Method", b"resources/read"),
            (b"Mcp-Name", "res://café".encode()),
        ),
    )
)
async def test_any_request_headers_get_a_forward_or_a_jsonrpc_error(env: Env, case: HeaderCase) -> None:
    params: dict[str, Any] = {"cursor": uuid.uuid4().hex}
    if case.method in NAME_FIELD:
        params[NAME_FIELD[case.method]] = case.name
    body = orjson.dumps(rpc(case.method, id_="h-1", **params))
    before = len(env.upstream.requests)
    status, headers, raw = await asyncio.wait_for(raw_post(env.server.port, list(case.lines), body), REQUEST_TIMEOUT_S)
    assert headers.get(b"cache-status", b"").startswith(b"mcp-gateway")

    outcome = -32020 if status == 400 else status
    event(f"HTTP {status}")
    assert outcome == expected_outcome(case), (status, raw, case)
    if status == 400:
        assert check_error_body(400, raw, "h-1")["error"]["code"] == -32020
        assert len(env.upstream.requests) == before
        return
    assert status == 200 and orjson.loads(raw)["id"] == "h-1"
    seen = env.upstream.requests[-1]
    assert seen.body == body
    sent = {(k.lower(), v.strip(b" \t")) for k, v in case.lines if k.lower().startswith(b"mcp")}
    got = {(k.lower(), v) for k, v in seen.raw_headers if k.lower().startswith(b"mcp")}
    assert got == sent, "a forwarded request-metadata header was altered"
    assert not any(k.lower() == b"authorization" for k, _ in seen.raw_headers)


# -- SSE framing from the upstream -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SSEPlan:
    items: tuple[tuple[str, Any], ...]
    endings: tuple[bytes, ...]
    space_after_colon: bool
    bom: bool
    truncate_at: int | None
    cuts: tuple[int, ...]
    pause: bool


def progress(n: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p", "progress": n}}


def response_for(request_id: object, kind: str) -> dict[str, Any]:
    if kind == "error":
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "no"}}
    return list_result(request_id, "private" if kind == "private" else "public", ttl_ms=600_000)


sse_plans = st.builds(
    SSEPlan,
    items=st.lists(
        st.one_of(
            st.tuples(st.just("progress"), st.integers(0, 9)),
            st.tuples(st.just("final"), st.sampled_from(["public", "private", "error"])),
            st.tuples(st.just("final-multiline"), st.just("public")),
            st.tuples(st.just("other-id"), st.sampled_from(["plus-one", "as-string", "null"])),
            st.tuples(st.just("comment"), st.sampled_from([b"", b" ping", b"keep-alive"])),
            st.tuples(
                st.just("garbage"),
                st.sampled_from(
                    [b"data: not json", b"data: {", b"nonsense", b"event: x", b"id: 9", b"retry: x", b"data :1"]
                ),
            ),
        ),
        max_size=8,
    ).map(tuple),
    endings=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=1, max_size=3).map(tuple),
    space_after_colon=st.booleans(),
    bom=st.booleans(),
    truncate_at=st.none() | st.integers(0, 600),
    cuts=st.lists(st.integers(0, 600), max_size=5).map(tuple),
    pause=st.booleans(),
)


def render(plan: SSEPlan, request_id: object) -> bytes:
    """The upstream's SSE bytes for ``plan`` (events ended by blank lines, in the plan's line endings)."""
    lines: list[bytes] = []
    sep = b": " if plan.space_after_colon else b":"
    for kind, arg in plan.items:
        if kind == "progress":
            lines += [b"event: message", b"data" + sep + orjson.dumps(progress(arg)), b""]
        elif kind == "final":
            lines += [b"data" + sep + orjson.dumps(response_for(request_id, arg)), b""]
        elif kind == "final-multiline":
            text = json.dumps(response_for(request_id, arg), indent=1).encode()
            lines += [b"data" + sep + part for part in text.split(b"\n")] + [b""]
        elif kind == "other-id":
            other = {"plus-one": request_id + 1, "as-string": str(request_id), "null": None}[arg]
            lines += [b"data" + sep + orjson.dumps(response_for(other, "public")), b""]
        elif kind == "comment":
            lines.append(b":" + arg)
        else:
            lines.append(arg)
    out = b"".join(line + plan.endings[i % len(plan.endings)] for i, line in enumerate(lines))
    if plan.bom:
        out = b"\xef\xbb\xbf" + out
    return out if plan.truncate_at is None else out[: plan.truncate_at]


def first_response(events: list[bytes], request_id: object) -> dict[str, Any] | None:
    for data in events:
        try:
            msg = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            continue
        if (
            isinstance(msg, dict)
            and msg.get("jsonrpc") == "2.0"
            and ("result" in msg or "error" in msg)
            and msg.get("id") == request_id
            and type(msg.get("id")) is type(request_id)
        ):
            return msg
    return None


@HTTP_SETTINGS
@given(plan=sse_plans, cacheable=st.booleans())
@example(  # the gateway's error after a cut inside an event
    plan=SSEPlan((("progress", 1), ("final", "public")), (b"\n",), True, False, 100, (), False), cacheable=True
)
@example(plan=SSEPlan((("final", "public"),), (b"\r",), True, False, None, (), False), cacheable=True)
@example(plan=SSEPlan((("final", "public"),), (b"\r\n",), True, False, None, (20, 21), True), cacheable=True)
async def test_any_sse_framing_is_relayed_unchanged_and_ends_with_one_response(
    env: Env, plan: SSEPlan, cacheable: bool
) -> None:
    request_id = 41
    stream = render(plan, request_id)

    async def answer(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        last = 0
        for cut in [*sorted({min(c, len(stream)) for c in plan.cuts}), len(stream)]:
            if cut > last:
                await resp.write(stream[last:cut])
                if plan.pause:
                    await asyncio.sleep(0.001)
            last = cut
        return resp

    env.upstream.answer = answer
    method, params = ("tools/list", {"cursor": uuid.uuid4().hex}) if cacheable else ("tools/call", {"name": "t"})
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": V, "Mcp-Method": method}
    if not cacheable:
        headers["Mcp-Name"] = "t"
    stored_before = len(env.app[STORE])

    async def send() -> tuple[int, str, bytes]:
        async with env.client.post(
            "/servers/up/mcp", data=orjson.dumps(rpc(method, request_id, **params)), headers=headers
        ) as resp:
            return resp.status, resp.content_type, await resp.read()

    try:
        status, ctype, raw = await asyncio.wait_for(send(), REQUEST_TIMEOUT_S)
    finally:
        env.upstream.answer = echo
    assert status == 200 and ctype == "text/event-stream"
    # The upstream's bytes come first, unchanged.
    assert raw.startswith(stream)
    tail = raw[len(stream) :]
    final = first_response(sse_events(stream), request_id)
    event("upstream answered" if final is not None else "gateway ended the stream")
    if final is not None:
        assert tail == b"", "the gateway added to a stream that had answered"
        stored = final.get("result", {}).get("cacheScope") == "public" and cacheable
        assert len(env.app[STORE]) == stored_before + (1 if stored else 0)
        return
    # No answer from the upstream: nothing is stored, and the gateway ends the stream so that the
    # caller reads exactly one response for this id. The blank lines that close the upstream's
    # unfinished event come first; if they complete the upstream's answer, that is the response,
    # else a JSON-RPC error event follows.
    assert len(env.app[STORE]) == stored_before
    assert tail.startswith(b"\n\n") and tail.endswith(b"\n\n"), tail
    completed = first_response(sse_events(stream + b"\n\n"), request_id)
    if completed is not None:
        assert tail == b"\n\n", tail
        seen = [m for m in sse_events(raw) if first_response([m], request_id) is not None]
        assert len(seen) == 1 and json.loads(seen[0]) == completed, raw
        return
    error = first_response(sse_events(tail), request_id)
    assert error is not None and error["error"]["code"] == -32603
    # What the caller's own SSE parser makes of the whole body: exactly one response, the error.
    seen = [m for m in sse_events(raw) if first_response([m], request_id) is not None]
    assert len(seen) == 1 and json.loads(seen[0])["error"]["code"] == -32603, raw


# -- 3. past gateway bugs, pinned --------------------------------------------------------------------------------------


async def sse_through_gateway(env: Env, stream: bytes, request_id: int = 7) -> bytes:
    async def answer(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(stream)
        return resp

    env.upstream.answer = answer
    headers = {
        "Content-Type": "application/json",
        "Accept": ACCEPT,
        "MCP-Protocol-Version": V,
        "Mcp-Method": "tools/list",
    }
    try:
        async with env.client.post(
            "/servers/up/mcp", data=orjson.dumps(rpc("tools/list", request_id)), headers=headers
        ) as resp:
            return await asyncio.wait_for(resp.read(), REQUEST_TIMEOUT_S)
    finally:
        env.upstream.answer = echo


async def test_sse_final_event_ended_by_a_lone_cr_at_eof_is_seen(env: Env) -> None:
    final = orjson.dumps(response_for(7, "public"))
    raw = await sse_through_gateway(env, b"data: " + final + b"\r\r")
    assert raw == b"data: " + final + b"\r\r"
    assert len(env.app[STORE]) == 1


async def test_error_after_a_stream_cut_mid_event_is_readable_by_the_caller(env: Env) -> None:
    raw = await sse_through_gateway(env, b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\n')
    responses = [m for m in sse_events(raw) if first_response([m], 7) is not None]
    assert len(responses) == 1 and json.loads(responses[0])["error"]["code"] == -32603


async def test_sse_stream_starting_with_a_bom_is_parsed(env: Env) -> None:
    final = orjson.dumps(response_for(7, "public"))
    raw = await sse_through_gateway(env, b"\xef\xbb\xbfdata: " + final + b"\n\n")
    assert raw == b"\xef\xbb\xbfdata: " + final + b"\n\n"


async def test_non_utf8_mcp_param_header_is_forwarded_unchanged_or_rejected(env: Env) -> None:
    body = orjson.dumps(rpc("tools/call", "p-1", name="lookup", arguments={"region": "eu-west", "key": "k"}))
    lines = [
        (b"Content-Type", b"application/json"),
        (b"MCP-Protocol-Version", V.encode()),
        (b"Mcp-Method", b"tools/call"),
        (b"Mcp-Name", b"lookup"),
        (b"Mcp-Param-Region", b"eu-we\xffst"),
    ]
    status, _, raw = await asyncio.wait_for(raw_post(env.server.port, lines, body), REQUEST_TIMEOUT_S)
    if status == 400:
        assert check_error_body(400, raw, "p-1")["error"]["code"] == -32020
        return
    got = [v for k, v in env.upstream.requests[-1].raw_headers if k.lower() == b"mcp-param-region"]
    assert got == [b"eu-we\xffst"]


@pytest.mark.parametrize("second", [b"Mcp-Name", b"mcp-name"], ids=["same-spelling", "other-case"])
async def test_conflicting_duplicate_mcp_name_headers_are_rejected(env: Env, second: bytes) -> None:
    body = orjson.dumps(rpc("tools/call", "d-1", name="add"))
    lines = [
        (b"Content-Type", b"application/json"),
        (b"MCP-Protocol-Version", V.encode()),
        (b"Mcp-Method", b"tools/call"),
        (b"Mcp-Name", b"add"),
        (second, b"delete_everything"),
    ]
    status, _, raw = await asyncio.wait_for(raw_post(env.server.port, lines, body), REQUEST_TIMEOUT_S)
    assert status == 400 and check_error_body(400, raw, "d-1")["error"]["code"] == -32020
    assert env.upstream.requests == []


@pytest.mark.parametrize(
    "body", [b"[" * 2000, jdump(rpc("tools/list")).replace(b'"_meta"', b'"x":' + b"[" * 950 + b"]" * 950 + b',"_meta"')]
)
async def test_deeply_nested_body_is_a_parse_error_not_a_500(env: Env, body: bytes) -> None:
    headers = {"Content-Type": "application/json", "MCP-Protocol-Version": V, "Mcp-Method": "tools/list"}
    async with env.client.post("/servers/up/mcp", data=body, headers=headers) as resp:
        raw = await resp.read()
        assert resp.status in (200, 400), raw
        if "detail=rejected" in resp.headers["Cache-Status"]:  # the gateway's own answer, not the upstream's
            assert resp.status == 400
            check_error_body(400, raw, readable_id(body))


async def test_numbers_beyond_float_range_do_not_share_a_cache_entry_with_null(env: Env) -> None:
    async def echo_cursor_text(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        match = re.search(rb'"cursor":([^,}]*)', await request.read())
        assert match is not None
        result = {"cursorText": match.group(1).decode(), "tools": [], "resultType": "complete"}
        answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {**result, "cacheScope": "public", "ttlMs": 600_000}}
        return web.json_response(answer)

    env.upstream.answer = echo_cursor_text
    headers = {"Content-Type": "application/json", "MCP-Protocol-Version": V, "Mcp-Method": "tools/list"}
    seen: list[tuple[str, str]] = []
    for cursor in (b"1e400", b"null"):
        body = jdump(rpc("tools/list", cursor="C")).replace(b'"C"', cursor)
        async with env.client.post("/servers/up/mcp", data=body, headers=headers) as resp:
            raw = await resp.read()
            if resp.status == 400:  # refusing a number JSON cannot carry exactly is fine too
                check_error_body(400, raw, 1)
                continue
            assert resp.status == 200, raw
            seen.append((resp.headers["Cache-Status"], json.loads(raw)["result"]["cursorText"]))
    # The request with cursor null got the answer to its own params, not the entry stored for 1e400.
    assert "hit" not in seen[-1][0] and seen[-1][1] == "null", seen


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(rpc("tools/list", id_="u16")).encode("utf-16"),
        jdump(rpc("tools/list", id_="u8", cursor="S")).replace(b'"S"', b'"\xed\xa0\x80"'),
    ],
    ids=["utf-16", "encoded-surrogate"],
)
async def test_body_that_is_not_utf8_is_a_parse_error(env: Env, body: bytes) -> None:
    headers = {"Content-Type": "application/json", "MCP-Protocol-Version": V, "Mcp-Method": "tools/list"}
    async with env.client.post("/servers/up/mcp", data=body, headers=headers) as resp:
        assert resp.status == 400
        assert check_error_body(400, await resp.read(), None)["error"]["code"] == -32700
    assert env.upstream.requests == []
