"""JSON-RPC envelopes (gateway.jsonrpc): the exact bytes of the bodies the gateway writes itself,
and what it reads of an answer (its id, its error code)."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequest
from gateway.httpserver import json_error_response
from gateway.jsonrpc import error_body, error_code, response_id_matches, result_body


def test_an_error_body_leaves_out_an_unread_id_unless_asked_for_null() -> None:
    assert error_body(-32600, "x") == b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"x"}}'
    assert error_body(-32600, "x", null_id=True) == b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}'
    assert error_body(-32602, "x", "a", {"k": 1}) == (
        b'{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"x","data":{"k":1}}}'
    )
    assert error_body(-32602, "x", 0, null_id=True) == b'{"jsonrpc":"2.0","id":0,"error":{"code":-32602,"message":"x"}}'


def test_the_routes_and_the_http_server_keep_their_error_bodies_byte_for_byte() -> None:
    # The routes' errors leave an unread id out; aiohttp's own refusals write "id": null.
    assert InvalidRequest("Invalid Request: a batch").body() == (
        b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request: a batch"}}'
    )
    assert json_error_response(400).body == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: Bad Request"}}'
    )
    assert json_error_response(500).body == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error (Internal Server Error)"}}'
    )


def test_a_result_body_is_the_compact_envelope_of_its_id_and_result() -> None:
    assert result_body(7, {"resultType": "complete"}) == b'{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete"}}'


def test_response_id_must_match_in_value_and_type() -> None:
    assert response_id_matches({"jsonrpc": "2.0", "id": 1, "result": {}}, 1)
    assert not response_id_matches({"jsonrpc": "2.0", "id": "1", "result": {}}, 1)
    assert not response_id_matches({"jsonrpc": "2.0", "id": 2, "result": {}}, 1)
    assert not response_id_matches({"jsonrpc": "2.0", "id": 1}, 1)
    assert not response_id_matches(["x"], 1)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "x"}}, -32602),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": True, "message": "x"}}, None),  # a bool is no code
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": 2**63, "message": "x"}}, None),  # fits no metric label
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -(2**63), "message": "x"}}, -(2**63)),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602.0, "message": "x"}}, None),
        ({"jsonrpc": "2.0", "id": 1, "error": "-32602"}, None),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, None),
        ([], None),
    ],
)
def test_error_code_is_an_integer_code_of_an_error_response_within_64_bits(message: object, code: int | None) -> None:
    assert error_code(message) == code
