"""Request parsing and validation (gateway.protocol): every error with its code and status; the
header sentinel and method labels."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from multidict import CIMultiDict

from gateway.errors import HeaderMismatch, InvalidParams, InvalidRequest, ParseError
from gateway.protocol import decode_header_value, method_label, parse_request

from .support import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, V, request_meta, sentinel


def body(method: str, params: dict[str, Any] | None = None, id_: object = 1, **extra: Any) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    msg["params"] = {"_meta": request_meta(), **(params or {})} if params is not False else None
    msg.update(extra)
    return orjson.dumps(msg)


def headers(method: str, version: str | None = V, name: str | None = None, **more: str) -> CIMultiDict[str]:
    h: CIMultiDict[str] = CIMultiDict()
    if version is not None:
        h["MCP-Protocol-Version"] = version
    h["Mcp-Method"] = method
    if name is not None:
        h["Mcp-Name"] = name
    for k, v in more.items():
        h[k.replace("_", "-")] = v
    return h


def test_valid_tools_list_is_modern_and_cacheable() -> None:
    parsed = parse_request(body("tools/list"), headers("tools/list"))
    assert (parsed.era, parsed.kind, parsed.version, parsed.request_id) == ("modern", "request", V, 1)
    assert parsed.cacheable


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe", b"not json"])
def test_unparsable_body_is_parse_error_400(raw: bytes) -> None:
    with pytest.raises(ParseError) as info:
        parse_request(raw, headers("tools/list"))
    assert (info.value.code, info.value.status) == (-32700, 400)


def test_batch_is_invalid_request_400() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(b"[" + body("tools/list") + b"]", headers("tools/list"))
    assert (info.value.code, info.value.status) == (-32600, 400)


@pytest.mark.parametrize(
    "raw",
    [
        b"1",
        b'"x"',
        b"null",
        b'{"jsonrpc":"2.0","id":1}',
        b'{"jsonrpc":"2.0","id":null,"method":"x"}',
        b'{"jsonrpc":"2.0","id":1.5,"method":"x"}',
        b'{"jsonrpc":"2.0","id":true,"method":"x"}',
        b'{"jsonrpc":"1.0","id":1,"method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":1,"method":7}',
    ],
)
def test_non_request_objects_are_invalid_request(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(raw, headers("tools/list"))
    assert info.value.code == -32600 and info.value.status == 400


def test_invalid_request_echoes_a_readable_id() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(b'{"jsonrpc":"2.0","id":"abc","method":5}', headers("x"))
    assert info.value.request_id == "abc"
    assert orjson.loads(info.value.body())["id"] == "abc"


@pytest.mark.parametrize(
    "params",
    [
        {"_meta": {PROTOCOL_VERSION_KEY: V}},
        {"_meta": {CLIENT_CAPABILITIES_KEY: {}, "x": 1}, "y": 2},
        {"_meta": {PROTOCOL_VERSION_KEY: 5, CLIENT_CAPABILITIES_KEY: {}}},
        {"_meta": {PROTOCOL_VERSION_KEY: V, CLIENT_CAPABILITIES_KEY: []}},
        {"_meta": "x"},
        {},
    ],
)
def test_missing_required_meta_is_invalid_params_400_with_id(params: dict[str, Any]) -> None:
    raw = orjson.dumps({"jsonrpc": "2.0", "id": "r-9", "method": "tools/list", "params": params})
    with pytest.raises(InvalidParams) as info:
        parse_request(raw, headers("tools/list"))
    assert (info.value.code, info.value.status, info.value.request_id) == (-32602, 400, "r-9")


def test_version_header_disagreeing_with_body_is_header_mismatch() -> None:
    with pytest.raises(HeaderMismatch) as info:
        parse_request(body("tools/list"), headers("tools/list", version="2099-01-01"))
    assert (info.value.code, info.value.status, info.value.request_id) == (-32020, 400, 1)


def test_modern_meta_without_version_header_is_header_mismatch() -> None:
    with pytest.raises(HeaderMismatch):
        parse_request(body("tools/list"), headers("tools/list", version=None))


@pytest.mark.parametrize("mcp_method", [None, "tools/call", "Tools/List", ""])
def test_mcp_method_header_missing_or_different_is_header_mismatch(mcp_method: str | None) -> None:
    h = headers("tools/list")
    del h["Mcp-Method"]
    if mcp_method is not None:
        h["Mcp-Method"] = mcp_method
    with pytest.raises(HeaderMismatch):
        parse_request(body("tools/list"), h)


@pytest.mark.parametrize(
    ("method", "field"), [("tools/call", "name"), ("prompts/get", "name"), ("resources/read", "uri")]
)
def test_mcp_name_must_mirror_the_body(method: str, field: str) -> None:
    raw = body(method, {field: "res://café" if field == "uri" else "add"})
    value = "res://café" if field == "uri" else "add"
    assert parse_request(raw, headers(method, name=sentinel(value))).era == "modern"
    if value.isascii():
        assert parse_request(raw, headers(method, name=value)).era == "modern"
    for bad in (None, "other", sentinel("other"), "=?base64?!!!?="):
        with pytest.raises(HeaderMismatch):
            parse_request(raw, headers(method, name=bad))


def test_non_ascii_plain_mcp_name_is_rejected() -> None:
    raw = body("resources/read", {"uri": "res://café"})
    with pytest.raises(HeaderMismatch):
        parse_request(raw, headers("resources/read", name="res://café"))


@pytest.mark.parametrize(
    ("raw", "hdrs"),
    [
        (body("initialize", False), headers("initialize", version=None)),
        (body("tools/list"), headers("tools/list", version="2025-11-25")),
        (body("tools/list"), headers("tools/list", Mcp_Session_Id="abc")),
        (orjson.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}), headers("tools/list", version=None)),
        (orjson.dumps({"jsonrpc": "2.0", "id": 3, "result": {}}), headers("x", version="2025-11-25")),
    ],
)
def test_legacy_traffic_is_recognised_and_never_cacheable(raw: bytes, hdrs: CIMultiDict[str]) -> None:
    parsed = parse_request(raw, hdrs)
    assert parsed.era == "legacy"
    assert parsed.cache_bypass == "legacy"


def test_unknown_modern_version_is_forwarded_uncached() -> None:
    params = {"_meta": request_meta("2099-01-01")}
    raw = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params})
    parsed = parse_request(raw, headers("tools/list", version="2099-01-01"))
    assert parsed.era == "modern" and parsed.cache_bypass == "unknown-version"


@pytest.mark.parametrize("field", ["inputResponses", "requestState"])
def test_mrtr_retries_are_not_cacheable(field: str) -> None:
    raw = body("resources/read", {"uri": "res://x", field: "s" if field == "requestState" else {}})
    parsed = parse_request(raw, headers("resources/read", name="res://x"))
    assert parsed.cache_bypass == "input-responses"


@pytest.mark.parametrize("method", ["tools/call", "prompts/get", "completion/complete", "subscriptions/listen"])
def test_non_cacheable_methods_bypass(method: str) -> None:
    raw = body(method, {"name": "n"})
    parsed = parse_request(raw, headers(method, name="n"))
    assert parsed.cache_bypass == "uncacheable"


def test_notifications_are_forwarded_without_header_validation() -> None:
    raw = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"_meta": request_meta()}})
    parsed = parse_request(raw, headers("wrong"))
    assert parsed.kind == "notification" and not parsed.cacheable


def test_method_labels_are_bounded() -> None:
    assert method_label("tools/list") == "tools/list"
    assert method_label("secret-tool-name") == "other"
    assert method_label(None) == "other"


@given(st.text())
@example("=?base64?=?=")
@example("=?base64?AAAA?=")
def test_header_values_round_trip_through_the_base64_sentinel(value: str) -> None:
    assert decode_header_value(sentinel(value)) == value
