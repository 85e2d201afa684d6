"""Gateway errors (gateway.errors): the JSON-RPC error body each one answers with."""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError


def test_error_bodies_omit_unknown_ids() -> None:
    err = GatewayError("x")
    assert "id" not in orjson.loads(err.body())
    assert orjson.loads(GatewayError("x", request_id=0).body())["id"] == 0
