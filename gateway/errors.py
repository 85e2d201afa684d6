"""Every error the gateway answers itself, and the one function that turns one into a response.

Each error knows its JSON-RPC code and its HTTP status (MCP 2026-07-28, basic/index, 'Error
Codes'). A request the gateway rejects gets a JSON-RPC error with the request's ``id`` (basic/index,
'Error Responses') and a 4xx status: a bare 4xx would push a dual-era client into the legacy
fallback (basic/transports/streamable-http, 'Backward Compatibility'). Transport failures on the
way to an upstream become :class:`BadGateway` / :class:`GatewayTimeout` in ``gateway.upstream``;
an answer that is not a JSON-RPC response to the request becomes :class:`BadGateway` in
``gateway.proxy.forward``.

The tree is flat on purpose: one base class, one subclass per (code, status) pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from aiohttp import web

from .jsonrpc import error_body

__all__ = [
    "BadGateway",
    "Forbidden",
    "GatewayError",
    "GatewayTimeout",
    "HeaderMismatch",
    "InsufficientScope",
    "InvalidParams",
    "InvalidRequest",
    "Misdirected",
    "NotFound",
    "Overloaded",
    "ParseError",
    "PayloadTooLarge",
    "RequestTimeout",
    "Unauthorized",
    "error_response",
]

#: The realm of the MCP and registry routes' bearer challenge (RFC 6750 §3).
REALM: Final = "mcp-gateway"


class GatewayError(Exception):
    """An error the gateway answers itself: JSON-RPC ``code``, HTTP ``status``.

    ``request_id`` is echoed in the body when the request's id could be read; ``data`` goes
    into the error object; ``headers`` are added to the HTTP response.
    """

    code: int = -32603
    status: int = 500
    #: Whether the connection is closed after the answer (the rest of the request may follow).
    close_connection: bool = False

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
        """The JSON-RPC error response body (:func:`~gateway.jsonrpc.error_body`: no ``"id"``
        when the request's could not be read)."""
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
    """Required ``params._meta`` fields missing or of the wrong type (-32602, HTTP 400;
    MCP 2026-07-28, basic/index, '`_meta`', 'Per-request protocol fields')."""

    code = -32602
    status = 400


class HeaderMismatch(GatewayError):
    """A request-metadata header missing or disagreeing with the body (-32020, HTTP 400;
    MCP 2026-07-28, basic/transports/streamable-http, 'Server Validation')."""

    code = -32020
    status = 400


class UnsupportedProtocolVersion(GatewayError):
    """A protocol version this server does not speak (-32022, HTTP 400, ``data``: ``supported``
    and ``requested``; MCP 2026-07-28, basic/versioning, 'Protocol Version Negotiation')."""

    code = -32022
    status = 400


class NotFound(GatewayError):
    """No upstream of that name (HTTP 404 with -32601, which dual-era clients read as modern:
    MCP 2026-07-28, basic/transports/streamable-http, 'Protocol Version Header')."""

    code = -32601
    status = 404


class Unauthorized(GatewayError):
    """A missing, invalid or expired bearer token (HTTP 401 with ``WWW-Authenticate: Bearer``,
    RFC 6750 §3).

    The one 401 of the gateway: the MCP routes, the registry routes and the admin routes all
    answer it, each naming its realm. ``resource_metadata``: the called route's protected
    resource metadata URL (RFC 9728, 5.1; MCP 2026-07-28, basic/authorization, 'Protected
    Resource Metadata Discovery Requirements'); ``invalid_token``: a token was presented and
    refused (RFC 6750, 3.1: without a token the challenge carries no error code).
    """

    code = -32600
    status = 401

    def __init__(
        self,
        *,
        request_id: object = None,
        realm: str = REALM,
        resource_metadata: str | None = None,
        invalid_token: bool = False,
    ) -> None:
        challenge = f'Bearer realm="{realm}"'
        if resource_metadata is not None:
            challenge += f', resource_metadata="{resource_metadata}"'
        if invalid_token:
            challenge += ', error="invalid_token"'
        super().__init__(
            "Unauthorized: a valid bearer token is required",
            request_id=request_id,
            headers={"WWW-Authenticate": challenge},
        )


class Forbidden(GatewayError):
    """An ``Origin`` that is present and not allowed (HTTP 403; MCP 2026-07-28,
    basic/transports/streamable-http, 'Security & Endpoint': DNS rebinding)."""

    code = -32600
    status = 403


class InsufficientScope(GatewayError):
    """The caller's token lacks scopes the operation needs (HTTP 403 with ``WWW-Authenticate:
    Bearer error="insufficient_scope", scope="..."``; RFC 6750 §3.1; MCP 2026-07-28,
    basic/authorization, 'Scope Challenge Handling'). ``scopes``: every scope the operation
    needs, at once (the client asks for them all in one authorization). The route adds the
    challenge's ``resource_metadata`` (it knows its own metadata URL)."""

    code = -32600
    status = 403

    def __init__(self, scopes: Sequence[str], *, request_id: object = None, message: str | None = None) -> None:
        self.scopes = tuple(scopes)
        super().__init__(
            message or f"Forbidden: this needs the scopes {' '.join(self.scopes)}",
            request_id=request_id,
            headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{" ".join(self.scopes)}"'},
        )

    def add_resource_metadata(self, url: str | None) -> None:
        """Name the route's metadata URL in the challenge (once; the pipeline does it as it answers)."""
        challenge = self.headers["WWW-Authenticate"]
        if url is not None and "resource_metadata=" not in challenge:
            self.headers["WWW-Authenticate"] = f'{challenge}, resource_metadata="{url}"'


class Misdirected(GatewayError):
    """A ``Host`` that is not a loopback name on a loopback listener (HTTP 421 Misdirected
    Request, RFC 9110, section 15.5.20): how a DNS-rebinding page shows itself (MCP 2026-07-28,
    basic/transports/streamable-http, 'Security & Endpoint'). The spec gives no JSON-RPC code
    for it: -32600, as for the gateway's other refusals of a request as sent (401, 403, 408, 413)."""

    code = -32600
    status = 421


class MethodNotAllowed(GatewayError):
    """An HTTP method a modern-only endpoint does not serve (HTTP 405 with ``Allow: POST``; MCP
    2026-07-28, basic/transports/streamable-http, 'Sending Messages': no ``GET`` stream)."""

    code = -32600
    status = 405

    def __init__(self, message: str, *, request_id: object = None) -> None:
        super().__init__(message, request_id=request_id, headers={"Allow": "POST"})


class PayloadTooLarge(GatewayError):
    """A request body over ``listener.max_body_bytes`` (HTTP 413)."""

    code = -32600
    status = 413


class RequestTimeout(GatewayError):
    """The request body did not arrive within ``listener.body_timeout_s`` (HTTP 408; the
    connection is closed after the answer)."""

    code = -32600
    status = 408
    close_connection = True


class Overloaded(GatewayError):
    """Too many requests in flight to one upstream (HTTP 503; the raiser adds ``Retry-After``)."""

    code = -32603
    status = 503


class BadGateway(GatewayError):
    """The upstream was unreachable, reset the connection, redirected, answered more than
    ``max_response_bytes`` or something that is not a JSON-RPC answer to the request (-32603
    Internal error, HTTP 502)."""

    code = -32603
    status = 502


class GatewayTimeout(GatewayError):
    """The upstream did not answer in time (-32603 Internal error, HTTP 504)."""

    code = -32603
    status = 504


def error_response(err: GatewayError, cache_status: str | None = None) -> web.Response:
    """``err`` as an HTTP response: its status, its JSON-RPC body, its headers, and on MCP
    routes the ``Cache-Status`` (RFC 9211) of what happened before the error."""
    headers = {"Content-Type": "application/json"}
    if cache_status is not None:
        headers["Cache-Status"] = cache_status
    headers.update(err.headers)
    response = web.Response(body=err.body(), status=err.status, headers=headers)
    if err.close_connection:
        response.force_close()
    return response
