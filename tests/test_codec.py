"""Exact JSON (gateway.codec): what orjson would round or refuse is read as the standard library
reads it; what JSON does not allow is refused."""

from __future__ import annotations

import json

import pytest

from gateway.codec import dumps, loads


@pytest.mark.parametrize(
    "raw",
    [b"18446744073709551617", b"-9223372036854775809", b'{"a":[123456789012345678901234567890]}', b'"\\ud800"'],
)
def test_loads_is_exact_where_orjson_would_round_or_refuse(raw: bytes) -> None:
    assert loads(raw) == json.loads(raw)
    assert loads(dumps(loads(raw))) == json.loads(raw)


@pytest.mark.parametrize("raw", [b"NaN", b"[Infinity]", b"-Infinity"])
def test_loads_rejects_non_json_constants(raw: bytes) -> None:
    with pytest.raises(ValueError):
        loads(raw)
