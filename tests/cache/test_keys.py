"""Cache keys (gateway.cache.keys): what makes two requests one."""

from __future__ import annotations

from multidict import CIMultiDict

from gateway.cache import make_key
from gateway.protocol import parse_request

from ..support import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, V
from ..support.cache import key, request


def test_key_ignores_id_client_info_progress_token_and_trace_context() -> None:
    base = key()
    assert key(id_="other") == base
    extra = {
        "io.modelcontextprotocol/clientInfo": {"name": "x", "version": "9"},
        "progressToken": "p1",
        "traceparent": "00-abc-def-01",
        "tracestate": "a=b",
        "baggage": "k=v",
        "io.modelcontextprotocol/logLevel": "debug",
    }
    assert key(_extra_meta=extra) == base


def test_key_separates_upstream_method_params_version_and_capabilities() -> None:
    base = make_key("up", request(), vary_on_capabilities=True)
    assert make_key("other", request(), vary_on_capabilities=True) != base
    assert key(method="prompts/list") != base
    assert key(cursor="c2") != base
    assert key(cursor="") != base  # an empty cursor is a valid cursor, not "no cursor"
    assert key(caps={"elicitation": {}}) != base
    assert key(method="resources/read", uri="a://1") != key(method="resources/read", uri="a://2")
    other_version = request()
    object.__setattr__(other_version, "version", "2027-01-01")
    assert make_key("up", other_version, vary_on_capabilities=True) != base


def test_capabilities_are_keyed_canonically_and_can_be_disabled() -> None:
    a = key(caps={"elicitation": {"form": {}}, "roots": {}})
    b = key(caps={"roots": {}, "elicitation": {"form": {}}})
    assert a == b
    off = make_key("up", request(caps={"elicitation": {}}), vary_on_capabilities=False)
    assert off == make_key("up", request(caps={}), vary_on_capabilities=False)
    assert off.capabilities is None


def test_param_order_does_not_change_the_key() -> None:
    r1 = parse_request(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"x","_meta":{"'
        + PROTOCOL_VERSION_KEY.encode()
        + b'":"2026-07-28","'
        + CLIENT_CAPABILITIES_KEY.encode()
        + b'":{}},"z":1}}',
        CIMultiDict({"MCP-Protocol-Version": V, "Mcp-Method": "tools/list"}),
    )
    r2 = request(cursor="x", z=1)
    assert make_key("up", r1, vary_on_capabilities=True) == make_key("up", r2, vary_on_capabilities=True)
