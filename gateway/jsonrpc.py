"""JSON-RPC 2.0 envelopes: the answers the gateway writes itself, and what it reads of an answer.

No I/O and no aiohttp. Builders: :func:`error_body`, :func:`result_message` and
:func:`result_body`; readers: :func:`response_id_matches` and :func:`error_code`. Sources:
JSON-RPC 2.0, §5 (Response object) and §5.1 (Error object); MCP 2026-07-28, basic/index
('Responses', 'Error Responses') and the schema's ``JSONRPCErrorResponse``.
"""

from __future__ import annotations

from typing import Any, Final

from .codec import dumps

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "error_body",
    "error_code",
    "response_id_matches",
    "result_body",
    "result_message",
]

#: The error codes JSON-RPC 2.0 defines (§5.1) that the gateway answers with.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
INTERNAL_ERROR: Final = -32603


def error_body(
    code: int, message: str, request_id: object = None, data: object = None, *, null_id: bool = False
) -> bytes:
    """A JSON-RPC 2.0 error response, ``{"jsonrpc","id","error":{"code","message","data"}}`` as
    compact JSON bytes; ``data`` is left out when ``None``.

    A ``request_id`` of ``None`` (the request's id could not be read) leaves ``"id"`` out, as
    MCP's ``JSONRPCErrorResponse`` has it (``id`` optional, a string or an integer, never null):
    the MCP routes answer so. ``null_id`` writes ``"id": null`` instead, as JSON-RPC 2.0 §5 has
    it for an id that could not be detected: the answers to HTTP requests aiohttp could not
    parse (:mod:`gateway.httpserver`), for whatever client sent them. Each form is pinned by its
    tests and documented; changing either changes what clients read.
    """
    err: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    msg: dict[str, object] = {"jsonrpc": "2.0"}
    if request_id is not None or null_id:
        msg["id"] = request_id
    msg["error"] = err
    return dumps(msg)


def result_message(request_id: object, result: Any) -> dict[str, Any]:
    """A JSON-RPC 2.0 result response, ``{"jsonrpc": "2.0", "id": request_id, "result": result}``,
    as a dict (for an answer still to be stored or checked before it is written)."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def result_body(request_id: object, result: Any) -> bytes:
    """:func:`result_message` as compact JSON bytes.

    Raises:
        ValueError: ``result`` holds what JSON cannot carry (:func:`gateway.codec.dumps`).
    """
    return dumps(result_message(request_id, result))


def response_id_matches(message: object, request_id: object) -> bool:
    """Whether ``message`` is a JSON-RPC 2.0 response (result or error) for ``request_id``: the
    same id, of the same JSON type (``1`` is not ``"1"``, nor ``true``)."""
    return (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and ("result" in message or "error" in message)
        and message.get("id") == request_id
        and type(message.get("id")) is type(request_id)
    )


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def error_code(message: object) -> int | None:
    """The ``error.code`` of a JSON-RPC error response (JSON-RPC 2.0, §5.1: an integer), if it is
    an integer (a bool is not) that fits a metric label and a log line (64 bits); else ``None``."""
    if isinstance(message, dict) and isinstance(err := message.get("error"), dict):
        code = err.get("code")
        if type(code) is int and _INT64_MIN <= code <= _INT64_MAX:
            return code
    return None
