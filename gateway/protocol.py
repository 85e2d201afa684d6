"""MCP facts and request validation (no I/O): method names, versions, the request-metadata
headers, and what routing, validation and caching need from one POSTed message.

Sources (MCP 2026-07-28, https://modelcontextprotocol.io/specification/2026-07-28): basic/index
('Requests', '`_meta`', 'Error Codes'); basic/versioning, 'Backward Compatibility with
Initialization-Based Versions' (the era of a request); server/utilities/caching, 'Cacheable
Results' (the six methods whose results extend schema ``CacheableResult``); and
basic/transports/streamable-http, 'Request Metadata' and 'Value Encoding' (the
``MCP-Protocol-Version``, ``Mcp-Method`` and ``Mcp-Name`` headers and their base64 form).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from multidict import MultiMapping, istr

from .codec import duplicate_members, loads
from .errors import HeaderMismatch, InvalidParams, InvalidRequest, ParseError

__all__ = [
    "CACHEABLE_METHODS",
    "CLIENT_CAPABILITIES_KEY",
    "KNOWN_METHODS",
    "LEGACY_VERSIONS",
    "MODERN_VERSION",
    "MODERN_VERSIONS",
    "PROTOCOL_VERSION_KEY",
    "Era",
    "ParsedRequest",
    "decode_header_value",
    "encode_header_value",
    "method_label",
    "parse_request",
    "plain_parse_request",
]

MODERN_VERSION: Final = "2026-07-28"
#: Modern protocol versions this gateway knows how to validate and cache.
MODERN_VERSIONS: Final = frozenset({MODERN_VERSION})
#: Protocol versions of the legacy era (``initialize`` handshake, ``Mcp-Session-Id``).
LEGACY_VERSIONS: Final = frozenset({"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"})

PROTOCOL_VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"

#: The methods whose ``resultType:"complete"`` results carry ``ttlMs``/``cacheScope``
#: (MCP 2026-07-28, server/utilities/caching, 'Cacheable Results'; exactly the schema types
#: extending ``CacheableResult``).
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

#: Methods whose ``Mcp-Name`` header mirrors a body field (MCP 2026-07-28,
#: basic/transports/streamable-http, 'Standard Request Headers').
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


def method_label(method: str | None) -> str:
    """A bounded metric label for ``method``: the method itself if known, else ``other``."""
    return method if method in KNOWN_METHODS else "other"


def encode_header_value(value: str) -> str:
    """``value`` as an ``Mcp-Name`` header value: as it is when it is visible ASCII (space and
    tab allowed inside), else ``=?base64?<b64 of UTF-8>?=`` (MCP 2026-07-28,
    basic/transports/streamable-http, 'Value Encoding'). :func:`decode_header_value` inverts it."""
    plain = (
        value.isascii()
        and all(ch in "\t " or "!" <= ch <= "~" for ch in value)
        and value == value.strip(" \t")
        and not (value.startswith(_SENTINEL_PREFIX) and value.endswith(_SENTINEL_SUFFIX))
    )
    if plain:
        return value
    return (
        _SENTINEL_PREFIX + base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii") + _SENTINEL_SUFFIX
    )


def decode_header_value(value: str) -> str | None:
    """Decode an ``Mcp-Name``/``Mcp-Param-*`` value (MCP 2026-07-28,
    basic/transports/streamable-http, 'Value Encoding').

    Plain values are returned as they are; ``=?base64?<b64 of UTF-8>?=`` is decoded.
    Returns ``None`` when the sentinel form is not valid base64 or not UTF-8, or the plain
    value has characters outside visible ASCII, space and tab.
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
    much to build (``object.__setattr__`` per field) and one is built for every request. Requests
    whose text differs only in the id may share one ``params`` object (:func:`parse_request`).

    ``kind`` is ``request`` (has an id), ``notification`` (no id) or ``response`` (a legacy
    client's answer to a server request). ``version`` is the body's ``_meta`` protocol version
    for modern requests, the ``MCP-Protocol-Version`` header's value for notifications and
    legacy requests (``None`` when absent), and ``None`` for responses. ``cache_bypass`` is
    ``None`` when the request may be served from or stored in the cache, else the reason it may
    not (``uncacheable``, ``legacy``, ``notification``, ``input-responses``, ``unknown-version``).
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
    """:func:`plain_parse_request`, from a remembered parse when ``body`` is the text of a
    cacheable request parsed before but for its integer ``id`` (the same headers too).

    A cache hit's own work is mostly parsing its request (bench/RESULTS.md), and a client asking
    again sends the same text with the next id. Such a request (:func:`request_template`) is
    parsed whole the first time; then its template names its result, and a request of the same
    template gets that result with its own id (the same ``params`` object: read-only). Anything
    else, and every error, comes from :func:`plain_parse_request`, which this must equal
    (tests/test_protocol_templates.py).
    """
    # ✂ fast version of plain_parse_request, for the texts request_template describes
    found = request_template(body, headers)
    if found is None:
        return plain_parse_request(body, headers)
    request_id, key = found
    template = _TEMPLATES.get(key)
    if template is not None:
        return ParsedRequest("request", request_id, template.method, "modern", template.version, template.params, None)
    parsed = plain_parse_request(body, headers)
    if parsed.cache_bypass is None and parsed.request_id == request_id:
        if len(_TEMPLATES) >= TEMPLATES_MAX:
            del _TEMPLATES[next(iter(_TEMPLATES))]  # the oldest
        _TEMPLATES[key] = parsed
    return parsed
    # ✂


#: What names a request's parse but for its id: the text without the id, the
#: ``MCP-Protocol-Version`` and ``Mcp-Method`` values, the ``Mcp-Name`` values where the method
#: has a name.
Template = tuple[bytes, str, str, tuple[str, ...]]


def request_template(body: bytes, headers: MultiMapping[str]) -> tuple[int, Template] | None:
    """``(id, template)`` when ``body`` with ``headers`` parses as every request of its template
    does but for its integer ``id``, else ``None``: what :func:`parse_request` remembers parses
    by, and the hot path its cache keys (gateway.proxy.hot).

    Only texts of at most :data:`TEMPLATE_MAX_BYTES`, without an ``Mcp-Session-Id``, whose id
    is the value right after ``"jsonrpc":"2.0"`` at the start of the text, or the last member
    before the final ``}``, and is a plain integer (no sign, no leading zero, at most 18
    digits), with one ``MCP-Protocol-Version`` and one ``Mcp-Method``, qualify: the id's place in
    the text is then certain (``,"id":`` before the last ``}`` cannot be inside a string of valid
    JSON), and swapping one such integer for another changes nothing else.
    """
    if len(body) > TEMPLATE_MAX_BYTES or H_SESSION_ID in headers:
        return None
    token = rest = b""
    if body.startswith(_ID_FIRST):
        end = body.find(b",", _ID_FIRST_LEN)
        if end > 0:
            token, rest = body[_ID_FIRST_LEN:end], body[end:]  # rest starts with ","
    elif body.endswith(b"}"):
        at = body.rfind(_ID_LAST)
        if at > 0:
            token, rest = body[at + _ID_LAST_LEN : -1], body[:at]  # rest starts with "{"
    if not (token.isdigit() and len(token) <= 18 and (token[0] != 0x30 or len(token) == 1) and rest):
        return None
    versions = headers.getall(H_PROTOCOL_VERSION, ())
    methods = headers.getall(H_METHOD, ())
    if len(versions) != 1 or len(methods) != 1:
        return None
    method = methods[0]
    names = tuple(headers.getall(H_NAME, ())) if method in NAME_FIELD else ()
    return int(token), (rest, versions[0], method, names)


#: The parses :func:`parse_request` remembers, by template (:func:`request_template`): a pure
#: function's results, so one table serves every app of the process.
_TEMPLATES: Final[dict[Template, ParsedRequest]] = {}
#: At most this many (the oldest goes first), of texts of at most this many bytes (a list or
#: discover request is 150 to 400): 6 MiB with their parsed params at worst (measured with 512
#: texts of 1 KiB of short strings), however many different requests callers send; past that
#: many different requests in turn, each is parsed whole again.
TEMPLATES_MAX: Final = 512
TEMPLATE_MAX_BYTES: Final = 1024
_ID_FIRST: Final = b'{"jsonrpc":"2.0","id":'
_ID_FIRST_LEN: Final = len(_ID_FIRST)
_ID_LAST: Final = b',"id":'
_ID_LAST_LEN: Final = len(_ID_LAST)


def plain_parse_request(body: bytes, headers: MultiMapping[str]) -> ParsedRequest:
    """Parse and validate one POSTed MCP message against its headers.

    ``headers`` must be case-insensitive (aiohttp's ``CIMultiDictProxy``); a request-metadata
    header sent twice with different values is a mismatch (only one could be checked). Legacy-era
    messages (``initialize``, an ``Mcp-Session-Id``, a legacy ``MCP-Protocol-Version``, or
    neither that header nor a ``_meta`` protocol version) get only the JSON-RPC envelope checks
    (and the duplicate ``MCP-Protocol-Version`` check, which decides the era): they go to the
    upstream as they are. Modern notifications are not checked against their headers either.

    Raises:
        ParseError: the body is not JSON (-32700).
        InvalidRequest: a batch, a non-object, ``jsonrpc`` not ``"2.0"``, a bad ``id`` or
            ``method``, or a member name repeated in one object anywhere in the body (-32600).
        InvalidParams: a modern request whose ``params._meta`` is absent or lacks
            ``protocolVersion`` (a string) or ``clientCapabilities`` (an object) (-32602).
        HeaderMismatch: ``MCP-Protocol-Version`` sent twice with different values, or a modern
            request whose ``MCP-Protocol-Version``, ``Mcp-Method`` or (``tools/call``,
            ``prompts/get``, ``resources/read``) ``Mcp-Name`` header is missing, repeated with
            different values or disagrees with the body (-32020).
    """
    try:
        msg = loads(body)
        repeated = duplicate_members(body, msg)
    except ValueError as exc:
        raise ParseError("Parse error: body is not valid JSON") from exc
    if repeated:
        # The id is echoed only when it cannot be one of two values.
        request_id = msg.get("id") if type(msg) is dict and "id" not in repeated else None
        raise InvalidRequest(
            f"Invalid Request: member name {repeated[0]!r} appears twice in one object",
            request_id=request_id if type(request_id) in (str, int) else None,
        )
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
        # Header rules for notification POSTs are left undefined by 2026-07-28 (MCP 2026-07-28,
        # basic/transports/streamable-http, 'Sending Messages', Note).
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
        if not names:
            raise HeaderMismatch(
                f"Header mismatch: Mcp-Name header is required (params.{name_field})", request_id=request_id
            )
        decoded = decode_header_value(names[0])
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
