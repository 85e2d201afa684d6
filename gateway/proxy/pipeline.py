"""The one request pipeline of every MCP route: validate, authenticate, look up and answer, record.

:meth:`Pipeline.serve` is the template; a route (``/servers/{name}/mcp``, its legacy ``GET`` and
``DELETE`` streams, ``POST /mcp``, the other methods on ``/mcp``) supplies its steps as a
:class:`Route`, not a copy of the order. The order, on every route:

1. **Validate** the connection: the ``Host`` and ``Origin`` checks (MCP 2026-07-28,
   basic/transports/streamable-http, 'Security & Endpoint': DNS rebinding; the rules are in
   :mod:`gateway.proxy.origin`), the route's own check before the body (:meth:`Route.admit`),
   then the body within its bounds, parsed and checked against its headers ('Server Validation').
2. **Authenticate**: the caller's token (:class:`~gateway.auth.Authenticator`: a token not seen
   before is verified as the request comes in, before its body is read, the one await of this
   step; a static or remembered token costs none), and then what the request names (:meth:`Route.resolve`:
   the upstream), before any parse or header error is answered and before the cache, even for
   ``public`` entries: a cached answer is never a way around authentication (basic/authorization,
   'Token Handling'; server/utilities/caching, 'Security Considerations'), and a caller without a
   token learns nothing from an error. With ``[[policy.rules]]`` the caller's rights are known
   from here on (``ex.rights``): an upstream no rule allows is not found by :meth:`Route.resolve`.
   Then **authorize** (:meth:`Route.authorize`, only with rules): a call, get, read or completion
   of something no rule allows is refused here, never forwarded (:mod:`gateway.policy`): every
   route passes this point before its cache.
3. **Look up**: :meth:`Route.look_up`, the answer from the cache if it is there (no await: a hit
   is answered without one), **and answer** otherwise: :meth:`Route.answer` (the read-through, the
   upstream, or the route's own composition); a large answer is then written in chunks under the
   write deadline (:meth:`send`).
4. **Record**: metrics and the access log (:meth:`record`), whatever happened, 499 for a caller
   that went away first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError

from ..auth import ANONYMOUS, INVALID, Authenticator, SessionSource, presented_token
from ..cache.readthrough import HIT
from ..config import GatewayConfig
from ..errors import (
    Forbidden,
    GatewayError,
    InsufficientScope,
    Misdirected,
    ParseError,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    error_response,
)
from ..policy import Kind, Policy
from ..protocol import ParsedRequest, method_label, parse_request
from ..telemetry import ACCESS_LOGGER, GatewayMetrics, RequestJournal, RequestRecord
from .exchange import Exchange
from .origin import OriginPolicy
from .writing import CallerGone, CallerWriter

__all__ = ["Pipeline", "Route"]

access_log = logging.getLogger(ACCESS_LOGGER)
log = logging.getLogger("mcp_gateway.proxy")


class Route(Protocol):
    """The steps a route supplies to :meth:`Pipeline.serve`."""

    #: Whether requests carry a JSON-RPC body (``POST``) to read and parse.
    reads_body: bool

    def admit(self, ex: Exchange) -> None:
        """Before the body is read (``ex.request``'s headers only). Raises a :class:`GatewayError`."""

    def resolve(self, ex: Exchange, request_id: object) -> None:
        """Once the caller is authenticated, before any other error is told: what the request
        names exists (``ex.upstream``). Raises a :class:`GatewayError` with ``request_id``."""

    def authorize(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """With ``[[policy.rules]]`` (``ex.rights`` set), once resolved: what the request uses is
        allowed. Raises the denial (:meth:`Pipeline.denied`)."""

    def look_up(self, ex: Exchange, parsed: ParsedRequest | None) -> web.StreamResponse | None:
        """The answer if the cache has it, else ``None`` (``parsed`` is ``None`` for a route
        that reads no body)."""

    async def answer(self, ex: Exchange, parsed: ParsedRequest | None) -> web.StreamResponse:
        """The answer the cache did not have."""

    def label(self, ex: Exchange) -> str:
        """The ``upstream`` label of the request's record."""


def caller_gone(request: web.Request) -> bool:
    """Whether the caller's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


def sockname(request: web.Request) -> object:
    """The local address of the socket ``request`` arrived on (``(address, port, ...)``), or
    ``None`` once the connection is gone."""
    transport = request.transport
    return None if transport is None else transport.get_extra_info("sockname")


class Pipeline:
    """The steps every MCP route shares (see the module), for ``config``'s listener and
    ``[auth]``; ``writer`` writes large answers, ``metrics`` receives the records (through
    ``journal``, a new one by default); ``session`` gives the gateway's client session, for the
    identity provider (JWKS, introspection)."""

    def __init__(
        self,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        writer: CallerWriter,
        journal: RequestJournal | None = None,
        session: SessionSource | None = None,
    ) -> None:
        self.writer = writer
        # One journal an app (``journal``: the one of the pipeline before a reload): it alone
        # drains the records into the metrics before a scrape.
        self.journal = RequestJournal(metrics.request_metrics, access_log, metrics.auth) if journal is None else journal
        #: Who callers are (every route of this config: the registry routes share it).
        self.authenticator = Authenticator(config, session)
        self.verifies = self.authenticator.verifies
        #: ``None`` without rules: nothing is filtered or denied, and no step asks.
        self.policy = Policy(config.policy) if config.policy.rules else None
        public_base_url = config.registry.public_base_url
        self.origin_policy = OriginPolicy(
            config.listener.host,
            config.listener.allowed_origins,
            None if public_base_url is None else str(public_base_url),
        )
        #: The lookups that settle the common cases (see OriginPolicy).
        self.origins = self.origin_policy.origins
        self.hosts = self.origin_policy.hosts
        self.check_hosts = self.origin_policy.check_host
        self.max_body = config.listener.max_body_bytes
        self.body_timeout_s = config.listener.body_timeout_s

    async def serve(
        self, route: Route, request: web.Request, name: str, body: bytes | None = None
    ) -> web.StreamResponse:
        """The pipeline (see the module) of ``request`` on ``route``; ``name``: the upstream the
        path names (the route's own name for ``/mcp``); ``body``: the request's body when the
        caller has taken it from the connection already (:class:`~gateway.proxy.hot.HotProxy`),
        held to ``listener.max_body_bytes`` as a body read here is."""
        started = time.perf_counter()
        ex = Exchange(request, name)
        response: web.StreamResponse | None = None
        try:
            self.check_host(request)
            self.check_origin(request)
            if self.verifies:
                # A token not seen before is verified here, the one await of authentication
                # (a remembered or static token costs none); authenticate reads the verdict.
                token = presented_token(request.headers)
                verdict = self.authenticator.known(token)
                if verdict is None and token is not None:
                    verdict = await self.authenticator.verify(token)
                ex.verdict = verdict
            parsed: ParsedRequest | None = None
            if route.reads_body:
                route.admit(ex)
                try:
                    if body is None:
                        body = self.body_now(request)
                        if body is None:
                            body = await self.read_body(request)
                    elif len(body) > self.max_body:
                        raise self.too_large()
                except GatewayError:  # too large, too slow, undecodable: told once authenticated
                    self.authenticate(ex, None)
                    route.resolve(ex, None)
                    raise
                ex.body = body
                parsed = self.parse(ex, body, route)
            else:
                ex.method = request.method
            request_id = None if parsed is None else parsed.request_id
            self.authenticate(ex, request_id)
            route.resolve(ex, request_id)
            if ex.rights is not None:
                route.authorize(ex, parsed)
            response = route.look_up(ex, parsed)
            if response is None:
                response = await route.answer(ex, parsed)
            if ex.large:
                response = await self.send(ex, response)
        except asyncio.CancelledError:
            # aiohttp cancels the handler of a caller that went away (after its whole answer
            # was written, it went away at the end: answered)
            ex.disconnected = not ex.written
            raise
        except Exception as exc:
            response = self.failed(ex, exc)
        finally:
            self.record(ex, response, started, route.label(ex))
        return response

    # -- validate -----------------------------------------------------------------------------

    def check_host(self, request: web.Request) -> None:
        """Raises :class:`Misdirected` (HTTP 421) for a ``Host`` that is present and not a
        loopback name on a loopback bind (see :mod:`gateway.proxy.origin`)."""
        if self.check_hosts:
            host = request.headers.get(hdrs.HOST)
            if host is None or host in self.hosts:
                return
            if not self.origin_policy.host_allowed(host, sockname(request)):
                raise Misdirected(f"host {host!r} is not a loopback name, and this listener is bound to loopback")

    def check_origin(self, request: web.Request) -> None:
        """Raises :class:`Forbidden` (HTTP 403) for an ``Origin`` that is present and neither
        allowed nor one of the listener's own (see :mod:`gateway.proxy.origin`)."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or origin in self.origins:
            return
        if not self.origin_policy.origin_allowed(origin, sockname(request)):
            raise Forbidden(f"origin {origin!r} is not allowed")

    def usual_connection(self, request: web.Request) -> bool:
        """Whether :meth:`check_host` and :meth:`check_origin` pass at a glance: ``Host`` and
        ``Origin`` absent or among the listener's own (what nearly every request sends). A
        ``False`` is no refusal: the two checks decide."""
        headers = request.headers
        if self.check_hosts:
            host = headers.get(hdrs.HOST)
            if host is not None and host not in self.hosts:
                return False
        origin = headers.get(hdrs.ORIGIN)
        return origin is None or origin in self.origins

    def too_large(self) -> PayloadTooLarge:
        """The error of a body over ``listener.max_body_bytes`` (HTTP 413)."""
        return PayloadTooLarge(f"request body exceeds {self.max_body} bytes")

    def body_now(self, request: web.Request) -> bytes | None:
        """The whole body if it has arrived already (a small POST has, before the handler runs),
        taken from the connection's buffer without a copy; ``None`` when it must be awaited
        (:meth:`read_body`).

        Raises:
            PayloadTooLarge: the body is larger than ``listener.max_body_bytes`` (HTTP 413).
        """
        content = request.content
        if not content.is_eof() or content.exception() is not None:
            return None
        body = content.read_nowait()
        if len(body) > self.max_body:
            raise self.too_large()
        return body

    async def read_body(self, request: web.Request) -> bytes:
        """The whole request body, at most ``listener.max_body_bytes``, within
        ``listener.body_timeout_s`` seconds.

        Raises:
            RequestTimeout: the body did not arrive in time (HTTP 408).
            PayloadTooLarge: the body is larger, or its ``Content-Length`` says it would be,
                before any of it is read (HTTP 413; the connection is closed after it).
            ParseError: the body does not decode as its ``Content-Encoding`` says (HTTP 400).
        """
        if (request.content_length or 0) > self.max_body:  # refused before it is sent
            err = self.too_large()
            err.close_connection = True  # the body may follow: the connection cannot be reused
            raise err
        try:
            # Bounded in time as well as size: the body is read before the token is checked.
            async with asyncio.timeout(self.body_timeout_s):
                body = await request.read()
        except TimeoutError as exc:
            raise RequestTimeout(f"request body not received within {self.body_timeout_s:g} s") from exc
        except web.HTTPRequestEntityTooLarge as exc:
            raise self.too_large() from exc
        except RequestPayloadError as exc:  # e.g. Content-Encoding: gzip that is not gzip
            raise ParseError("Parse error: the body cannot be decoded as its Content-Encoding says") from exc
        if len(body) > self.max_body:
            raise self.too_large()
        return body

    def parse(self, ex: Exchange, body: bytes, route: Route) -> ParsedRequest:
        """Parse and validate ``body`` (see :func:`~gateway.protocol.parse_request`). A request
        that does not parse is authenticated and resolved first, so that a caller without a token
        learns nothing from the error."""
        try:
            parsed = parse_request(body, ex.request.headers)
        except GatewayError as err:
            self.authenticate(ex, err.request_id)
            route.resolve(ex, err.request_id)
            raise
        ex.parsed = parsed
        ex.method = method_label(parsed.method)
        return parsed

    # -- authenticate -------------------------------------------------------------------------

    def authenticate(self, ex: Exchange, request_id: object) -> None:
        """Set ``ex.caller`` (:class:`~gateway.auth.Caller`) to the caller the request's bearer
        token stands for (without ``[auth]``, :data:`~gateway.auth.ANONYMOUS`): a static token,
        or a JWT or introspected token whose audience is this route's resource URI (RFC 8707;
        MCP 2026-07-28, basic/authorization, 'Token Handling'). No await: a token not seen
        before was verified by :meth:`serve` (``ex.verdict``).

        Raises:
            Unauthorized: no token, or one that is invalid, expired or for another resource
                (HTTP 401; the challenge names this route's metadata URL, RFC 9728, 5.1).
            InsufficientScope: the caller lacks ``required_scopes`` (HTTP 403).
        """
        auth = self.authenticator
        if not auth.enabled:
            if self.policy is not None:  # rules without [auth]: what they grant any caller
                ex.rights = self.policy.rights(ANONYMOUS)
            return
        verdict = ex.verdict
        if verdict is None:
            verdict = auth.known(presented_token(ex.request.headers)) or INVALID
        resources = auth.resources
        caller = verdict.caller
        if caller is None or not verdict.accepts(resources.uri(ex.upstream_name)):
            ex.auth_outcome = verdict.outcome if caller is None else "invalid"
            raise Unauthorized(
                request_id=request_id,
                resource_metadata=resources.metadata_url(ex.upstream_name),
                invalid_token=verdict.outcome != "missing",
            )
        required = auth.required_scopes
        if required and not required <= caller.scopes:
            ex.auth_outcome = "insufficient_scope"
            raise InsufficientScope(sorted(required), request_id=request_id)
        ex.caller = caller
        ex.auth_outcome = "ok"
        if self.policy is not None:
            ex.rights = self.policy.rights(caller)

    def count_denied(self, ex: Exchange) -> None:
        """Count the request as ``denied`` in ``mcp_gateway_auth_total`` (a policy refused it)."""
        ex.auth_outcome = "denied"

    # -- authorize ----------------------------------------------------------------------------

    def denied(
        self, ex: Exchange, kind: Kind, upstream: str, name: str, request_id: object, *, shown: object = None
    ) -> GatewayError:
        """The answer to a ``kind`` ``name`` of ``upstream`` that no rule allows ``ex.caller``
        (:meth:`~gateway.policy.Policy.denial`: 403 insufficient_scope or -32602 naming ``shown``,
        the name as the caller sent it, ``name`` by default), counted in
        ``mcp_gateway_auth_total{outcome="denied"}``."""
        assert self.policy is not None
        self.count_denied(ex)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("policy: %s %s of %s refused to %s (%s)", kind, name, upstream, _who(ex), _matched(ex))
        return self.policy.denial(ex.caller, kind, upstream, name, request_id, shown=shown)

    def hidden(self, ex: Exchange, upstream: str) -> None:
        """Count and log a request to ``upstream``, which no rule shows ``ex.caller`` (it is
        answered as an unknown upstream): ``denied`` in ``mcp_gateway_auth_total``."""
        self.count_denied(ex)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("policy: upstream %s hidden from %s (%s)", upstream, _who(ex), _matched(ex))

    # -- answer -------------------------------------------------------------------------------

    async def send(self, ex: Exchange, response: web.StreamResponse) -> web.StreamResponse:
        """Write a large answer now, in chunks under the write deadline and the queue budget
        (:class:`~gateway.proxy.writing.CallerWriter`); returns what the handler returns. A
        caller that goes away or is dropped meanwhile sets ``ex.disconnected``."""
        try:
            return await self.writer.send(ex.request, response, written=ex)
        except CallerGone:
            ex.disconnected = True
            return response

    def failed(self, ex: Exchange, exc: Exception) -> web.Response:
        """The answer to a request that raised ``exc``: a :class:`GatewayError` is answered as
        itself, aiohttp's own HTTP exceptions go on to aiohttp, anything else is a bug
        (:meth:`internal_error`)."""
        if isinstance(exc, GatewayError):
            return self.error(ex, exc)
        if isinstance(exc, web.HTTPException):
            raise exc
        if isinstance(exc, ConnectionResetError) and caller_gone(ex.request):
            # Writing to a caller that went away: its doing, not a failure of the gateway.
            ex.disconnected = True
            log.debug("caller went away on %s %s: %s", ex.request.method, ex.request.path, exc)
            return web.Response(status=499)
        return self.internal_error(ex)

    def error(self, ex: Exchange, err: GatewayError) -> web.Response:
        """The gateway's own error answer (``detail=rejected`` unless the request was forwarded)."""
        ex.error_code = err.code
        if isinstance(err, InsufficientScope):
            # Raised here or by a policy step: the challenge names this route's metadata URL.
            err.add_resource_metadata(self.authenticator.resources.metadata_url(ex.upstream_name))
            if ex.auth_outcome != "denied" and self.authenticator.enabled:
                ex.auth_outcome = "insufficient_scope"
        if ex.fwd is None and ex.hit is None:
            ex.detail = "rejected"
        return error_response(err, ex.cache_status())

    def internal_error(self, ex: Exchange) -> web.Response:
        """A bug, not a protocol error: logged with its traceback, answered as a JSON-RPC
        internal error (HTTP 500) and counted, without the traceback reaching the caller."""
        request = ex.request
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return self.error(ex, GatewayError("Internal error in the gateway"))

    # -- record -------------------------------------------------------------------------------

    def record(self, ex: Exchange, response: web.StreamResponse | None, started: float, label: str) -> None:
        """The request's record, to the journal (metrics and access log, in batches), under the
        upstream label ``label``."""
        ended = time.perf_counter()
        lookup = ex.lookup
        self.journal.add(
            # Positional, in the order of RequestRecord's fields: a third of the cost of keywords,
            # and every request, hits included, builds one.
            RequestRecord(
                label,
                ex.method,
                ex.request.method,
                499 if response is None or ex.disconnected else response.status,  # 499: the caller went away
                ex.error_code,
                "bypass" if lookup is None else lookup.cache,
                ex.cache_status(),
                ended - started,
                lookup,
                ended,
                ex.upstream_seconds,
                ex.caller.subject,
                ex.auth_outcome,
            )
        )

    def record_hit(self, label: str, method: str, cache_status: str, started: float) -> None:
        """:meth:`record` of a ``POST`` answered ``200`` from a fresh entry of upstream ``label``
        with no ``[auth]`` (the record the hot path keeps, :class:`~gateway.proxy.hot.HotProxy`):
        ``method`` the method label, ``cache_status`` the answer's ``Cache-Status``, ``started``
        the ``time.perf_counter()`` seconds the request came in at."""
        ended = time.perf_counter()
        self.journal.add(
            RequestRecord(
                label, method, "POST", 200, None, HIT.cache, cache_status, ended - started, HIT, ended, None, None, None
            )
        )


def _who(ex: Exchange) -> str:
    """The caller of ``ex`` as logs name it: its subject, or the kind of token it presented."""
    caller = ex.caller
    return caller.subject if caller.subject is not None else f"a {caller.kind} caller"


def _matched(ex: Exchange) -> str:
    """The rules ``ex.caller`` matched, as logs name them."""
    rules = () if ex.rights is None else ex.rights.rules
    return "matched rules: " + ", ".join(rule.name for rule in rules) if rules else "it matched no rule"
