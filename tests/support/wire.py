"""The MCP wire (2026-07-28) as a correct client writes and reads it, for building requests in tests.

Written from the spec, not imported from ``gateway``, so that a wrong constant in the gateway
fails a test instead of agreeing with it. Sources: Base Protocol ("_meta"), the caching utility
(the methods whose results extend ``CacheableResult``), Streamable HTTP ("Request metadata
headers": ``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name`` and the ``=?base64?…?=`` form of
SEP-2243), and the WHATWG HTML "event stream interpretation" for SSE.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson

V = "2026-07-28"
LEGACY_V = "2025-11-25"
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
ACCEPT = "application/json, text/event-stream"

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"

#: The methods whose complete results carry ``ttlMs`` and ``cacheScope``.
CACHEABLE = (
    "server/discover",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
)
#: The params member that ``Mcp-Name`` mirrors, per method.
NAME_FIELD = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

SENTINEL_PREFIX, SENTINEL_SUFFIX = b"=?base64?", b"?="


def request_meta(version: str = V, caps: object = None, **more: Any) -> dict[str, Any]:
    """The ``_meta`` every modern request carries (version, client capabilities), plus ``more``."""
    return {PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: {} if caps is None else caps, **more}


def rpc(
    method: str,
    id_: object = 1,
    caps: object = None,
    meta: dict[str, Any] | None = None,
    *,
    version: str = V,
    **params: Any,
) -> dict[str, Any]:
    """A modern JSON-RPC request: ``params`` with ``_meta`` (version, capabilities, then ``meta``)."""
    m = request_meta(version, caps, **(meta or {}))
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": {"_meta": m, **params}}


def sentinel(value: str) -> str:
    """``value`` in the base64 form of a request-metadata header."""
    return (SENTINEL_PREFIX + base64.b64encode(value.encode()) + SENTINEL_SUFFIX).decode()


def header_value(value: str) -> str:
    """A request-metadata header value: plain when visible ASCII, else the base64 sentinel (SEP-2243)."""
    plain = value == value.strip(" \t") and all(" " <= ch <= "~" or ch == "\t" for ch in value)
    return value if plain and not value.startswith("=?base64?") else sentinel(value)


def mcp_headers(method: str, name: str | None = None, *, version: str = V, **extra: str) -> dict[str, str]:
    """The headers of a modern POST: ``Mcp-Name`` (encoded as :func:`header_value`) when given;
    ``extra`` is added last and may replace any of them."""
    h = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": version, "Mcp-Method": method}
    if name is not None:
        h["Mcp-Name"] = header_value(name)
    h.update(extra)
    return h


def list_result(request_id: object, scope: str = "public", ttl_ms: int = 60_000) -> dict[str, Any]:
    """A complete ``tools/list`` answer with one tool ``t``."""
    result = {
        "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
        "resultType": "complete",
        "cacheScope": scope,
        "ttlMs": ttl_ms,
    }
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def sse_frame(msg: object, eol: bytes = b"\n") -> bytes:
    """One ``message`` event carrying ``msg``, its lines ended by ``eol``."""
    return b"event: message" + eol + b"data: " + orjson.dumps(msg) + eol + eol


def sse_events(raw: bytes, *, at_eof: bool = True) -> list[bytes]:
    """Reference SSE parser (WHATWG HTML "event stream interpretation"), data payloads only.

    Lines end at CRLF, LF or CR; a leading BOM is dropped; at EOF an event without its blank line
    is discarded, but a CR that ends the input still ends its line (not so with ``at_eof=False``:
    a CR at the end of a chunk may be the start of a CRLF).
    """
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    events: list[bytes] = []
    data: list[bytes] = []
    i, n = 0, len(raw)
    while i < n:
        j = i
        while j < n and raw[j] not in b"\r\n":
            j += 1
        if j == n:
            break  # an unterminated last line is discarded
        if raw[j] == 13 and j + 1 == n and not at_eof:
            break
        line = raw[i:j]
        i = j + 2 if raw[j : j + 2] == b"\r\n" else j + 1
        if not line:
            if data:
                events.append(b"\n".join(data))
            data = []
            continue
        if line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
    return events


def sse_messages(raw: bytes) -> list[Any]:
    """The JSON messages of the complete events in an SSE body."""
    return [json.loads(e) for e in sse_events(raw)]
