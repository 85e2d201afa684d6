"""aiohttp's own error answers, as JSON-RPC errors that quote nothing of the request.

A request aiohttp's HTTP parser refuses (bare ``\\n`` line ends, a CR or NUL in a header value,
two ``Host`` headers, a bad method or version, a line too long, too many headers, bad chunked
framing) never reaches a route: aiohttp answers it itself, through
``RequestHandler.handle_error``, with a plain-text 400 whose text is the parser's, quoting the
offending bytes (``Authorization`` included). So does an exception that escapes a handler (a
plain-text 500). :class:`JsonErrorRequestHandler` answers them instead with a JSON-RPC error,
``"id": null`` (the request could not be read), a fixed message naming the kind of error, and
nothing of the request. aiohttp still logs them as before, through ``aiohttp.server``, where
:mod:`gateway.telemetry.serverlog` cuts each to one short line and bounds their rate.

HOOK (aiohttp private API): ``web.Server`` builds each connection's handler by the name
``RequestHandler`` of its module, ``aiohttp.web_server``. :func:`install_json_errors` points that
name at the subclass, for every server of this process (``mcp-gateway serve`` calls it once,
before it serves). If aiohttp is not shaped as expected, it leaves aiohttp alone (its plain-text
answers, still logged without request text) and says so once.
"""

from __future__ import annotations

import inspect
import logging
from http import HTTPStatus
from typing import Any, Final

from aiohttp import web, web_server
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentEncodingError,
    ContentLengthError,
    DecompressSizeError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
    TransferEncodingError,
)
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from .jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR, error_body

__all__ = ["JsonErrorRequestHandler", "install_json_errors", "json_error_response"]

log = logging.getLogger("mcp_gateway")

#: What each kind of parser error is called in the answer, most specific first. Only these
#: fixed words go out: an exception's own text quotes the request.
_KINDS: Final[tuple[tuple[type[HttpProcessingError], int, str], ...]] = (
    (BadHttpMethod, INVALID_REQUEST, "Invalid Request: invalid HTTP method"),
    (BadStatusLine, INVALID_REQUEST, "Invalid Request: malformed HTTP request line or line ending"),
    (LineTooLong, INVALID_REQUEST, "Invalid Request: HTTP request line or header field too long"),
    (InvalidHeader, INVALID_REQUEST, "Invalid Request: invalid HTTP header"),
    (InvalidURLError, INVALID_REQUEST, "Invalid Request: invalid request target"),
    (TransferEncodingError, PARSE_ERROR, "Parse error: invalid chunked transfer encoding"),
    (ContentLengthError, PARSE_ERROR, "Parse error: the body does not match its Content-Length"),
    (DecompressSizeError, PARSE_ERROR, "Parse error: the body decompresses to too many bytes"),
    (ContentEncodingError, PARSE_ERROR, "Parse error: the body cannot be decoded as its Content-Encoding says"),
    (PayloadEncodingError, PARSE_ERROR, "Parse error: the request body cannot be read"),
    (HttpProcessingError, INVALID_REQUEST, "Invalid Request: malformed HTTP request"),
)


def json_error_response(status: int, exc: BaseException | None = None) -> web.Response:
    """The JSON-RPC error answering what aiohttp answers with ``status`` (a parser error: 400;
    an exception out of a handler: 500; a timeout out of one: 504), for ``exc``. Its message
    is fixed text chosen by the class of ``exc``; the connection is closed after it."""
    if status >= 500:
        code, message = INTERNAL_ERROR, f"Internal error ({_phrase(status)})"
    else:
        code, message = INVALID_REQUEST, f"Invalid Request: {_phrase(status)}"
        for kind, kind_code, kind_message in _KINDS:
            if isinstance(exc, kind):
                code, message = kind_code, kind_message
                break
    # "id": null, where the MCP routes leave "id" out: see error_body.
    body = error_body(code, message, null_id=True)
    resp = web.Response(status=status, body=body, content_type="application/json")
    resp.force_close()
    return resp


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's request handler (one per connection), answering its own errors as JSON-RPC
    errors (:func:`json_error_response`)."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        # aiohttp's own steps first: its logging (one short line, see serverlog) and its check
        # that nothing of an answer was sent yet (else ConnectionError). Its text answer,
        # which quotes the request, is dropped.
        super().handle_error(request, status, exc, "")
        return json_error_response(status, exc)


_warned = False


def _hook_is_as_expected(module: Any) -> bool:
    """Whether ``module`` is aiohttp's ``web_server`` as this hook knows it: its ``Server``
    builds handlers by the module-level name ``RequestHandler``, which is aiohttp's class (or
    already ours), whose ``handle_error`` takes the arguments overridden above."""
    current = getattr(module, "RequestHandler", None)
    server = getattr(module, "Server", None)
    code = getattr(vars(server).get("__call__") if isinstance(server, type) else None, "__code__", None)
    if current is JsonErrorRequestHandler:
        return True
    if current is not RequestHandler or code is None or "RequestHandler" not in code.co_names:
        return False
    try:
        params = list(inspect.signature(RequestHandler.handle_error).parameters)
    except (TypeError, ValueError):
        return False
    return params == ["self", "request", "status", "exc", "message"]


def install_json_errors(module: Any = web_server) -> bool:
    """Make every aiohttp server of this process (``module``: aiohttp's ``web_server``)
    answer its own errors as JSON-RPC errors (:class:`JsonErrorRequestHandler`); idempotent.

    Returns whether it could: if aiohttp is not as expected, its own answers stay, and this is
    logged once. aiohttp's log lines of them are cut short and rate-bounded either way
    (:func:`~gateway.telemetry.quiet_server_errors`, which ``setup_logging`` installs).
    """
    global _warned
    if _hook_is_as_expected(module):
        module.RequestHandler = JsonErrorRequestHandler
        return True
    if not _warned:
        _warned = True
        log.warning(
            "this aiohttp does not build its request handlers as expected: requests it cannot parse "
            "get aiohttp's own plain-text answers, not JSON-RPC errors (their text is still kept out of the log)"
        )
    return False
