"""Pure MCP / JSON-RPC facts and request validation for the gateway (no I/O).

Everything here follows MCP revision 2026-07-28 (see ``shared/spec/2026-07-28-digest.md``):
method names, the six cacheable methods (caching utility, SEP-2549), error codes and
their HTTP statuses (basic/index#error-codes), the request-metadata headers and their
base64 sentinel (transports/streamable-http, SEP-2243) and era detection (basic/versioning).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson
from multidict import MultiMapping, istr

try:  # the ``speed`` extra: relayed answers are checked without building their result
    import simdjson
except ImportError:  # pragma: no cover - exercised by forcing _ENVELOPE_PARSER to None
    simdjson = None  # type: ignore[assignment]

__all__ = [
    "CACHEABLE_METHODS",
    "CLIENT_CAPABILITIES_KEY",
    "ENVELOPE_MAX_BYTES",
    "ENVELOPE_MIN_BYTES",
    "KNOWN_METHODS",
    "LEGACY_VERSIONS",
    "MODERN_VERSION",
    "MODERN_VERSIONS",
    "PROTOCOL_VERSION_KEY",
    "BadGateway",
    "Era",
    "GatewayError",
    "GatewayTimeout",
    "HeaderMismatch",
    "InvalidParams",
    "InvalidRequest",
    "ParseError",
    "ParsedRequest",
    "SSEParser",
    "decode_header_value",
    "dumps",
    "error_body",
    "id_json",
    "loads",
    "loads_relayed",
    "method_label",
    "parse_request",
    "response_id_matches",
]

MODERN_VERSION: Final = "2026-07-28"
#: Modern protocol versions this gateway knows how to validate and cache.
MODERN_VERSIONS: Final = frozenset({MODERN_VERSION})
#: Protocol versions of the legacy era (``initialize`` handshake, ``Mcp-Session-Id``).
LEGACY_VERSIONS: Final = frozenset({"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"})

PROTOCOL_VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"

#: The methods whose ``resultType:"complete"`` results carry ``ttlMs``/``cacheScope``
#: (caching utility page; exactly the schema types extending ``CacheableResult``).
CACHEABLE_METHODS: Final = frozenset(
    {
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    }
)

#: Methods whose ``Mcp-Name`` header mirrors a body field (streamable-http, SEP-2243).
NAME_FIELD: Final[Mapping[str, str]] = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
}

#: Method names used as metric labels; anything else is reported as ``other``.
KNOWN_METHODS: Final = frozenset(
    CACHEABLE_METHODS
    | NAME_FIELD.keys()
    | {
        "completion/complete",
        "subscriptions/listen",
        "initialize",
        "notifications/initialized",
        "notifications/cancelled",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/get",
        "tasks/update",
        "tasks/cancel",
    }
)

#: Request params whose presence marks an MRTR retry; such results are never cached.
MRTR_PARAMS: Final = ("inputResponses", "requestState")

Era = Literal["modern", "legacy"]


#: Header names as ``istr``: a case-insensitive lookup with one skips folding the name.
H_PROTOCOL_VERSION: Final = istr("MCP-Protocol-Version")
H_METHOD: Final = istr("Mcp-Method")
H_NAME: Final = istr("Mcp-Name")
H_SESSION_ID: Final = istr("Mcp-Session-Id")

_SENTINEL_PREFIX: Final = "=?base64?"
_SENTINEL_SUFFIX: Final = "?="


class GatewayError(Exception):
    """An error the gateway answers itself, as a JSON-RPC error with a fixed HTTP status.

    ``code`` is the JSON-RPC error code, ``status`` the HTTP status (digest §0.2, §0.3);
    ``request_id`` is echoed in the error body when the request's id could be read.
    """

    code: int = -32603
    status: int = 500

    def __init__(
        self,
        message: str,
        *,
        request_id: object = None,
        data: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.data = data
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        """The JSON-RPC error response body (``id`` omitted when unknown)."""
        return error_body(self.code, self.message, self.request_id, self.data)


class ParseError(GatewayError):
    """The body is not JSON (-32700, HTTP 400)."""

    code = -32700
    status = 400


class InvalidRequest(GatewayError):
    """Not a single JSON-RPC request object, e.g. a batch (-32600, HTTP 400)."""

    code = -32600
    status = 400


class InvalidParams(GatewayError):
    """Required ``params._meta`` fields missing (-32602, HTTP 400 MUST; basic/index)."""

    code = -32602
    status = 400


class HeaderMismatch(GatewayError):
    """A request-metadata header missing or disagreeing with the body (-32020, HTTP 400 MUST)."""

    code = -32020
    status = 400


class BadGateway(GatewayError):
    """The upstream was unreachable, reset the connection or answered something that is not
    JSON-RPC (-32603 Internal error, HTTP 502)."""

    code = -32603
    status = 502


class GatewayTimeout(GatewayError):
    """The upstream did not answer in time (-32603 Internal error, HTTP 504)."""

    code = -32603
    status = 504


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: orjson turns integers outside [-2**63, 2**64) into floats, silently: any run of 19+
#: digits sends the text to the standard library, which keeps integers exact. The run is
#: found by mapping every digit to ``0`` and everything else to a space, then a substring
#: search: both in C, ~15x faster than a regular expression (~30 µs, not ~430 µs, on a
#: 19 KB ``tools/list``).
_DIGITS_TO_ZERO: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGITS: Final = b"0" * 19


def loads(data: bytes) -> Any:
    """Parse JSON (RFC 8259) exactly: orjson, or the standard library for what orjson
    refuses or rounds but JSON allows (integers beyond 64 bits, lone surrogate escapes).

    Raises:
        ValueError: not JSON (``NaN``/``Infinity`` literals included).
    """
    # find(), not "in": bytes.__contains__ first tries the needle as an integer and raises
    # (and clears) a TypeError on every call.
    if data.translate(_DIGITS_TO_ZERO).find(_LONG_DIGITS) < 0:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        # Strict UTF-8 first: json.loads(bytes) would guess UTF-16/32 (RFC 8259 §8.1: UTF-8).
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant, parse_float=_parse_float)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def loads_relayed(data: bytes, request_id: object) -> Any:
    """Parse an upstream answer that is relayed, not stored, for its envelope: ``jsonrpc``,
    ``id`` and ``error.code`` (the bytes relayed are the upstream's own).

    A success of ``ENVELOPE_MIN_BYTES`` to ``ENVELOPE_MAX_BYTES``, with simdjson installed (the
    ``speed`` extra), comes back as ``{"jsonrpc", "id", "result": True}`` (the members present): the
    whole document is validated, the result is not built (~15 µs instead of ~110 µs for a
    19 KB ``tools/list``). Anything else (errors, duplicate or odd top-level members, what
    simdjson refuses) is parsed by orjson, without :func:`loads`'s scan for long integers:
    an integer beyond 64 bits comes back as a float, which changes nothing here unless the
    request's id is such an integer (then :func:`loads`). A float error code is not logged
    as a code.

    Raises:
        ValueError: not JSON.
    """
    if type(request_id) is int and not _INT64_MIN <= request_id <= _UINT64_MAX:
        return loads(data)
    if _ENVELOPE_PARSER is not None and ENVELOPE_MIN_BYTES <= len(data) <= ENVELOPE_MAX_BYTES:
        envelope = _envelope(_ENVELOPE_PARSER, data)
        if envelope is not None:
            return envelope
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return loads(data)  # what orjson refuses but JSON allows (lone surrogate escapes)


#: Relayed answers of these sizes are checked with simdjson, when installed. The parser keeps
#: buffers for the largest document it parsed (1.8 MB after a 256 KB one): bounded.
ENVELOPE_MIN_BYTES: Final = 2048
ENVELOPE_MAX_BYTES: Final = 256 * 1024
_ENVELOPE_PARSER: Any = simdjson.Parser(max_capacity=ENVELOPE_MAX_BYTES) if simdjson is not None else None
_ENVELOPE_SCALARS: Final = (str, int, float, bool, type(None))


def _envelope(parser: Any, data: bytes) -> dict[str, Any] | None:
    """The envelope of a JSON-RPC success in ``data``, or ``None`` to let orjson decide."""
    try:
        doc = parser.parse(data)
    except (ValueError, RuntimeError):  # not JSON to simdjson, or a number beyond 64 bits
        return None
    try:
        if not isinstance(doc, simdjson.Object) or "error" in doc or "result" not in doc:
            return None
        keys = list(doc.keys())
        if len(keys) != len(set(keys)):
            return None  # duplicate members: orjson keeps the last, simdjson the first
        envelope: dict[str, Any] = {"result": True}
        for name in ("jsonrpc", "id"):
            if name in doc:
                value = doc[name]
                if type(value) not in _ENVELOPE_SCALARS:
                    return None  # an object or array (no JSON-RPC answer has one there)
                envelope[name] = value
        return envelope
    finally:
        # The parser is reused: nothing may keep a reference into this document.
        del doc


_INT64_MIN: Final = -(2**63)
_UINT64_MAX: Final = 2**64 - 1


class Unrepresentable(float):
    """A JSON number beyond the float range (``1e400``): kept apart from ``null`` (orjson
    would write ``inf`` as ``null``), refused by :func:`dumps`, so never part of a cache
    key or a stored result."""


def _parse_float(text: str) -> float:
    value = float(text)
    return value if value not in (_INF, -_INF) else Unrepresentable(value)


_INF: Final = float("inf")


def dumps(value: object, *, sort_keys: bool = False) -> bytes:
    """Serialise to compact JSON with orjson; values orjson cannot write (integers beyond
    64 bits, lone surrogates) go through the standard library, ASCII-escaped.

    Raises:
        ValueError: ``value`` holds a non-finite float (no JSON for it).
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except TypeError:  # orjson.JSONEncodeError: big integers, lone surrogates, Unrepresentable
        try:
            return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), allow_nan=False).encode()
        except RecursionError as exc:
            raise ValueError("JSON nested too deeply") from exc


def id_json(request_id: object) -> bytes:
    """The JSON of a JSON-RPC id (a string or an integer; :func:`dumps` for big integers)."""
    try:
        return orjson.dumps(request_id)
    except TypeError:
        return dumps(request_id)


def error_body(code: int, message: str, request_id: object = None, data: object = None) -> bytes:
    """Serialise a JSON-RPC 2.0 error response; ``id`` is left out when ``None`` (basic/index)."""
    err: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    msg: dict[str, object] = {"jsonrpc": "2.0"}
    if request_id is not None:
        msg["id"] = request_id
    msg["error"] = err
    return dumps(msg)


def method_label(method: str | None) -> str:
    """A bounded metric label for ``method``: the method itself if known, else ``other``."""
    return method if method in KNOWN_METHODS else "other"


def decode_header_value(value: str) -> str | None:
    """Decode an ``Mcp-Name``/``Mcp-Param-*`` value (streamable-http, SEP-2243).

    Plain values are returned as they are; ``=?base64?<b64 of UTF-8>?=`` is decoded.
    Returns ``None`` when the sentinel form does not decode to UTF-8 or the plain value
    has characters outside visible ASCII, space and tab.
    """
    if value.startswith(_SENTINEL_PREFIX) and value.endswith(_SENTINEL_SUFFIX):
        payload = value[len(_SENTINEL_PREFIX) : len(value) - len(_SENTINEL_SUFFIX)]
        try:
            return base64.b64decode(payload, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
    if value.isascii() and value.isprintable():  # space to "~": the usual value, in C
        return value
    if not all(ch in "\t " or "!" <= ch <= "~" for ch in value):
        return None
    return value


@dataclass(slots=True)
class ParsedRequest:
    """What routing, validation and caching need from one POSTed JSON-RPC message.

    Read-only by convention: not ``frozen``, because a frozen dataclass costs four times as
    much to build (``object.__setattr__`` per field) and one is built for every request.

    ``kind`` is ``request`` (has an id), ``notification`` (no id) or ``response`` (a legacy
    client's answer to a server request). ``version`` is the body's protocol version for
    modern requests. ``cache_bypass`` is ``None`` when the request may be served from or
    stored in the cache, else the reason it may not (``uncacheable``, ``legacy``,
    ``notification``, ``input-responses``, ``unknown-version``).
    """

    kind: Literal["request", "notification", "response"]
    request_id: object
    method: str | None
    era: Era
    version: str | None
    params: Mapping[str, Any] | None
    cache_bypass: str | None

    @property
    def cacheable(self) -> bool:
        return self.cache_bypass is None


def parse_request(body: bytes, headers: MultiMapping[str]) -> ParsedRequest:
    """Parse and validate one POSTed MCP message against its headers.

    ``headers`` must be case-insensitive (aiohttp's ``CIMultiDictProxy``); a request-metadata
    header sent twice with different values is a mismatch (only one could be checked). Legacy-era
    messages (``initialize``, an ``Mcp-Session-Id``, a legacy ``MCP-Protocol-Version``, or
    neither that header nor modern ``_meta``) are only parsed, never validated: they go to
    the upstream as they are.

    Raises:
        ParseError: the body is not JSON (-32700).
        InvalidRequest: a batch, a non-object, a bad ``id`` or ``method`` (-32600).
        InvalidParams: modern request without both required ``_meta`` fields (-32602).
        HeaderMismatch: a modern request whose ``MCP-Protocol-Version``, ``Mcp-Method`` or
            ``Mcp-Name`` header is missing or disagrees with the body (-32020).
    """
    try:
        msg = loads(body)
    except ValueError as exc:
        raise ParseError("Parse error: body is not valid JSON") from exc
    if type(msg) is not dict:
        if isinstance(msg, list):
            raise InvalidRequest("Invalid Request: JSON-RPC batches are not supported")
        raise InvalidRequest("Invalid Request: expected a JSON-RPC object")
    # Exact types throughout: loads() makes only dict, list, str, int, float (or a float
    # subclass), bool and None, and a bool is not an id.
    request_id = msg.get("id", _NO_ID)
    if request_id is _NO_ID:
        has_id = False
        request_id = None
    elif type(request_id) is str or type(request_id) is int:
        has_id = True
    else:
        raise InvalidRequest("Invalid Request: id must be a string or an integer")
    if msg.get("jsonrpc") != "2.0":
        raise InvalidRequest('Invalid Request: jsonrpc must be "2.0"', request_id=request_id)
    method = msg.get("method")
    if type(method) is not str:
        if method is None and has_id and ("result" in msg or "error" in msg):
            return ParsedRequest("response", request_id, None, "legacy", None, None, "legacy")
        raise InvalidRequest("Invalid Request: method must be a string", request_id=request_id)
    params = msg.get("params")
    meta = params.get("_meta") if type(params) is dict else None
    if type(meta) is dict:
        body_version = meta.get(PROTOCOL_VERSION_KEY)
    else:
        meta = body_version = None
    # Each metadata header is read once, all its values: one sent twice with different
    # values is a mismatch (only one could be compared with the body).
    versions = headers.getall(H_PROTOCOL_VERSION, ())
    if versions:
        header_version = versions[0]
        if len(versions) > 1 and len(set(versions)) > 1:
            raise HeaderMismatch(
                "Header mismatch: MCP-Protocol-Version sent with different values", request_id=request_id
            )
    else:
        header_version = None
    if (
        method == "initialize"
        or H_SESSION_ID in headers
        or header_version in LEGACY_VERSIONS
        or (header_version is None and body_version is None)
    ):
        return ParsedRequest(
            "request" if has_id else "notification", request_id, method, "legacy", header_version, params, "legacy"
        )
    if not has_id:
        # Header rules for notification POSTs are left undefined by 2026-07-28 (§13.9).
        return ParsedRequest("notification", request_id, method, "modern", header_version, params, "notification")
    if header_version is None:
        raise HeaderMismatch("Header mismatch: MCP-Protocol-Version header is required", request_id=request_id)

    if meta is None:
        raise InvalidParams("Invalid params: params._meta is required", request_id=request_id)
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY, _NO_ID)
    if type(body_version) is not str or type(capabilities) is not dict:
        missing = [k for k in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if k not in meta]
        if missing:
            raise InvalidParams(f"Invalid params: params._meta is missing {', '.join(missing)}", request_id=request_id)
        raise InvalidParams(
            "Invalid params: protocolVersion must be a string and clientCapabilities an object",
            request_id=request_id,
        )
    methods = headers.getall(H_METHOD, ())
    if len(methods) > 1 and len(set(methods)) > 1:
        raise HeaderMismatch("Header mismatch: Mcp-Method sent with different values", request_id=request_id)
    name_field = NAME_FIELD.get(method)
    if name_field is not None:
        # Mcp-Name is checked on tools/call, prompts/get and resources/read only.
        names = headers.getall(H_NAME, ())
        if len(names) > 1 and len(set(names)) > 1:
            raise HeaderMismatch("Header mismatch: Mcp-Name sent with different values", request_id=request_id)
    if header_version != body_version:
        raise HeaderMismatch(
            "Header mismatch: MCP-Protocol-Version header does not match _meta protocolVersion",
            request_id=request_id,
        )
    if not methods or methods[0] != method:
        raise HeaderMismatch("Header mismatch: Mcp-Method header must equal method", request_id=request_id)
    if name_field is not None:
        decoded = decode_header_value(names[0]) if names else None
        if decoded is None or decoded != params.get(name_field):  # type: ignore[union-attr]
            raise HeaderMismatch(
                f"Header mismatch: Mcp-Name header must equal params.{name_field}", request_id=request_id
            )

    if method not in CACHEABLE_METHODS:
        bypass: str | None = "uncacheable"
    elif body_version not in MODERN_VERSIONS:
        bypass = "unknown-version"
    elif "inputResponses" in params or "requestState" in params:  # type: ignore[operator]  # MRTR_PARAMS
        bypass = "input-responses"
    else:
        bypass = None
    return ParsedRequest("request", request_id, method, "modern", body_version, params, bypass)


#: ``msg.get("id", _NO_ID)``: tells an absent id from ``"id": null`` in one lookup.
_NO_ID: Final = object()


class SSEParser:
    """Incremental ``text/event-stream`` parser (WHATWG HTML, server-sent events).

    :meth:`feed` takes raw bytes as they arrive and returns the ``data`` payload of each
    event completed by them (multi-line data joined with ``\\n``); comments and other
    fields are ignored. An event larger than ``max_event_bytes`` marks the parser
    ``overflowed`` and it stops collecting.
    """

    __slots__ = ("_buf", "_data", "_max", "_started", "overflowed")

    def __init__(self, max_event_bytes: int) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._max = max_event_bytes
        self._started = False
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.overflowed:
            return []
        self._buf += chunk
        if not self._started:
            if len(self._buf) < len(_BOM) and _BOM.startswith(self._buf):
                return []  # maybe a byte order mark, split across chunks
            self._started = True
            if self._buf.startswith(_BOM):  # the stream's leading BOM is not data (WHATWG)
                self._buf = self._buf[len(_BOM) :]
        events: list[bytes] = []
        while True:
            cut = _next_line_end(self._buf)
            if cut is None:
                break
            end, nxt = cut
            line, self._buf = self._buf[:end], self._buf[nxt:]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":
                self._data.append(b"")
        if len(self._buf) + sum(len(d) for d in self._data) > self._max:
            self.overflowed = True
            self._buf, self._data = b"", []
        return events

    def finish(self) -> list[bytes]:
        """At the end of the stream: a trailing ``\r`` ends its line (it was held back in
        case ``\n`` followed); an event without its blank line is dropped (WHATWG)."""
        return self.feed(b"\n") if self._buf.endswith(b"\r") else []


_BOM: Final = b"\xef\xbb\xbf"


def _next_line_end(buf: bytes) -> tuple[int, int] | None:
    """Position of the first line ending in ``buf`` and of the byte after it."""
    cr, lf = buf.find(b"\r"), buf.find(b"\n")
    if cr == -1 and lf == -1:
        return None
    if cr != -1 and (lf == -1 or cr < lf):
        if cr + 1 == len(buf):
            return None  # a \r at the end may still be followed by \n
        return (cr, cr + 2) if buf[cr + 1 : cr + 2] == b"\n" else (cr, cr + 1)
    return (lf, lf + 1)


def response_id_matches(message: object, request_id: object) -> bool:
    """Whether ``message`` is a JSON-RPC 2.0 response (result or error) for ``request_id``."""
    return (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and ("result" in message or "error" in message)
        and message.get("id") == request_id
        and type(message.get("id")) is type(request_id)
    )
