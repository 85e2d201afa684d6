"""Probes: the gateway's own ``server/discover`` to an upstream, and when to send the next one.

* The schedule, :func:`probe_delay` and :func:`backoff_delay`: pure functions. Jitter and
  backoff are a MUST for anyone who polls (MCP 2026-07-28, server/utilities/caching,
  'Freshness Calculation').
* The verdicts, :func:`classify_discover` and :func:`classify_initialize`: pure functions from an
  answer to a :class:`~.state.ProbeResult`, with era detection and the legacy ``initialize``
  fallback (MCP 2026-07-28, server/discover; Streamable HTTP, 'Backward Compatibility';
  basic/versioning, 'Backward Compatibility with Initialization-Based Versions').
* :class:`Prober`: the exchanges themselves, through :class:`~gateway.upstream.Upstream`, with
  the small request helpers the listen stream (:mod:`.listen`) uses too. Only the gateway's own
  headers and the upstream's configured ones go out: no caller's ``Authorization`` can reach an
  upstream this way (MCP 2026-07-28, basic/authorization, 'Token Handling'; Security Best
  Practices, 'Token Passthrough').
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import orjson
from multidict import CIMultiDict

from ..errors import GatewayError
from ..jsonrpc import error_code, response_id_matches
from ..protocol import (
    CLIENT_CAPABILITIES_KEY,
    MODERN_VERSION,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
)
from ..sse import SSEParser
from ..upstream import Upstream
from .state import ProbeResult, bounded_versions, is_version

__all__ = [
    "CLIENT_INFO",
    "LEGACY_HANDSHAKE_VERSION",
    "PROBE_JITTER",
    "Prober",
    "Rng",
    "backoff_delay",
    "classify_discover",
    "classify_initialize",
    "probe_delay",
]

log = logging.getLogger("mcp_gateway.registry")

CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
#: The version the legacy ``initialize`` fallback asks for (the newest legacy revision).
LEGACY_HANDSHAKE_VERSION: Final = "2025-11-25"
#: Probes of a healthy upstream come up to this fraction early (never late), so a fleet
#: started at once does not stay in lock-step.
PROBE_JITTER: Final = 0.2
#: Longest ``instructions`` kept for display, in characters.
MAX_INSTRUCTIONS_CHARS: Final = 8192

_MODERN_ERRORS: Final = frozenset({-32020, -32021, -32022})
_UNSUPPORTED_VERSION: Final = -32022
_ACCEPT: Final = "application/json, text/event-stream"

#: A source of floats in ``[0, 1)`` for jitter.
Rng = Callable[[], float]


def _gateway_version() -> str:
    try:
        return metadata.version("mcp-gateway")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


#: ``clientInfo`` of the gateway's own traffic (probes, listen streams).
CLIENT_INFO: Final = {"name": "mcp-gateway", "version": _gateway_version()}


# -- schedule (pure) ------------------------------------------------------------------------------


def probe_delay(ttl_ms: int | None, *, min_s: float, max_s: float, rng: Rng) -> float:
    """Seconds until the next probe of an upstream whose last probe succeeded.

    The discover result's ``ttlMs`` (milliseconds; ``None`` or absent means 0, MCP 2026-07-28,
    server/utilities/caching, 'Time-to-Live (TTL) Field') is clamped to ``[min_s, max_s]``
    seconds, then brought forward by up to :data:`PROBE_JITTER` of itself: the result lies in
    ``(base * (1 - PROBE_JITTER), base]``. ``rng()`` returns a float in ``[0, 1)``. TTL is never
    used as the polling interval unbounded (server/utilities/caching, 'Freshness Calculation').
    """
    ttl_s = max(0, ttl_ms or 0) / 1000
    base = min(max(ttl_s, min_s), max_s)
    return base * (1 - PROBE_JITTER * rng())


def backoff_delay(failures: int, *, base_s: float, max_s: float, rng: Rng) -> float:
    """Seconds to wait after ``failures`` consecutive failures (``failures >= 1``).

    Capped exponential backoff with "equal jitter": the step is ``min(max_s, base_s * 2**(failures-1))``
    and the delay lies in ``[step / 2, step)``, so retries spread out but never collapse to zero.
    """
    exponent = min(max(failures, 1) - 1, 62)
    step = min(max_s, base_s * (2.0**exponent))
    return step / 2 + rng() * step / 2


# -- verdicts (pure) --------------------------------------------------------------------------------


def _server_info(value: object) -> Mapping[str, Any] | None:
    """The display fields of a self-reported ``Implementation`` (never used for decisions)."""
    if not isinstance(value, dict):
        return None
    keep = ("name", "title", "version", "description", "websiteUrl")
    info = {k: value[k][:1024] for k in keep if isinstance(value.get(k), str)}
    return info or None


def _instructions(value: object) -> str | None:
    return value[:MAX_INSTRUCTIONS_CHARS] if isinstance(value, str) else None


def classify_discover(status: int, message: object) -> ProbeResult | None:
    """Judge the answer to the gateway's ``server/discover`` (MCP 2026-07-28, Streamable HTTP,
    'Backward Compatibility'; basic/versioning, 'Backward Compatibility with Initialization-Based
    Versions'; server/discover).

    ``message`` is the JSON-RPC response to the probe (``None`` when the body held none).
    Returns ``None`` when the upstream looks legacy (any other JSON-RPC error, a bare 4xx,
    something that is not a ``DiscoverResult``): the caller then tries ``initialize``.

    * a ``DiscoverResult`` → modern, up;
    * ``-32022`` → modern, ``data.supported`` recorded; degraded unless it names a version
      this gateway speaks;
    * ``-32020``/``-32021`` → modern (recognised modern errors: no fallback), degraded;
    * HTTP 5xx → down (no era signal); 401/403 → down (the configured headers are wrong).
    """
    code = error_code(message)
    if code == _UNSUPPORTED_VERSION:
        err = message["error"] if isinstance(message, dict) else {}
        data = err.get("data") if isinstance(err, dict) else None
        supported = bounded_versions(data.get("supported") if isinstance(data, dict) else None) or ()
        common = [v for v in supported if v in MODERN_VERSIONS]
        return ProbeResult(
            health="degraded",
            outcome="unsupported-version",
            detail=(
                f"rejected {MODERN_VERSION} with -32022 although it lists {', '.join(common)}"
                if common
                else f"speaks no protocol version this gateway knows ({MODERN_VERSION}); capabilities unknown"
            ),
            era="modern",
            advertised=supported,
        )
    if code in _MODERN_ERRORS:
        return ProbeResult(
            health="degraded", outcome="rejected", detail=f"server/discover rejected with {code}", era="modern"
        )
    if status >= 500:
        return ProbeResult(health="down", outcome="unreachable", detail=f"server/discover answered HTTP {status}")
    if status in (401, 403):
        return ProbeResult(
            health="down",
            outcome="unauthorized",
            detail=f"server/discover answered HTTP {status}; check this upstream's configured headers",
        )
    if status != 200 or code is not None or not isinstance(message, dict):
        return None
    result = message.get("result")
    if not isinstance(result, dict) or result.get("resultType", "complete") != "complete":
        return None
    advertised = bounded_versions(result.get("supportedVersions"))
    capabilities = result.get("capabilities")
    if not advertised or not isinstance(capabilities, dict):
        return None
    meta = result.get("_meta")
    ttl = result.get("ttlMs")
    return ProbeResult(
        health="up",
        outcome="modern",
        era="modern",
        advertised=advertised,
        capabilities=capabilities,
        server_info=_server_info(meta.get(SERVER_INFO_KEY) if isinstance(meta, dict) else None),
        instructions=_instructions(result.get("instructions")),
        ttl_ms=ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0 else None,
    )


def classify_initialize(status: int, message: object, discover_detail: str) -> ProbeResult:
    """Judge the answer to the legacy ``initialize`` fallback (2025-11-25 lifecycle).

    An ``InitializeResult`` (``protocolVersion``, ``capabilities``, ``serverInfo``) means a legacy
    upstream that is up; HTTP 5xx means down; anything else means the upstream answers neither
    era recognisably (degraded, era unknown). ``discover_detail`` says what ``server/discover`` got.
    """
    if status >= 500:
        return ProbeResult(health="down", outcome="unreachable", detail=f"initialize answered HTTP {status}")
    result = message.get("result") if isinstance(message, dict) else None
    version = result.get("protocolVersion") if isinstance(result, dict) else None
    if status == 200 and isinstance(result, dict) and isinstance(version, str) and is_version(version):
        capabilities = result.get("capabilities")
        return ProbeResult(
            health="up",
            outcome="legacy",
            era="legacy",
            advertised=(version,),
            capabilities=capabilities if isinstance(capabilities, dict) else {},
            server_info=_server_info(result.get("serverInfo")),
            instructions=_instructions(result.get("instructions")),
        )
    code = error_code(message)
    got = f"JSON-RPC error {code}" if code is not None else f"HTTP {status}"
    return ProbeResult(
        health="degraded",
        outcome="unrecognised",
        detail=f"neither era answered: {discover_detail}; initialize got {got}",
        era="unknown",
    )


# -- talking to an upstream ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    message: object
    session_id: str | None


def json_or_none(data: bytes) -> object:
    """``data`` parsed as JSON, or ``None`` when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def modern_request(method: str, request_id: str, params: Mapping[str, Any], version: str) -> bytes:
    """A modern JSON-RPC request of the gateway's own: its ``_meta`` declares no capabilities."""
    meta = {PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: {}, CLIENT_INFO_KEY: CLIENT_INFO}
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}})


def modern_headers(upstream: Upstream, method: str, version: str) -> CIMultiDict[str]:
    """The HTTP headers of :func:`modern_request`: ours and the upstream's configured ones."""
    ours = {
        "Content-Type": "application/json",
        "Accept": _ACCEPT,
        "MCP-Protocol-Version": version,
        "Mcp-Method": method,
    }
    # Only our own headers go in: the upstream's configured ones are added, a caller's never.
    return upstream.request_headers(ours, allow_authorization=False)


async def _exchange(
    upstream: Upstream, http_method: str, body: bytes | None, headers: CIMultiDict[str], request_id: str | None
) -> _Reply:
    """One HTTP exchange; the JSON-RPC response to ``request_id`` is read from a JSON or an SSE
    body (MCP 2026-07-28, Streamable HTTP, 'Sending Messages', item 6). Bounded by the caller's
    timeout and ``max_response_bytes``.

    Raises:
        GatewayError: unreachable, timed out, redirect (from :class:`Upstream`).
    """
    loop = asyncio.get_running_loop()
    async with upstream.open(http_method, body, headers) as resp:
        session_id = resp.headers.get("Mcp-Session-Id")
        if request_id is None:
            # Read (and drop) the body so the connection can be reused.
            await upstream.read_body(resp, loop.time() + upstream.config.timeout_s)
            return _Reply(resp.status, None, session_id)
        if resp.content_type == "text/event-stream":
            parser = SSEParser(upstream.config.max_response_bytes)
            async for chunk in upstream.iter_stream(resp):
                for data in parser.feed(chunk):
                    message = json_or_none(data)
                    if response_id_matches(message, request_id):
                        return _Reply(resp.status, message, session_id)
                if parser.overflowed:
                    break
            return _Reply(resp.status, None, session_id)
        data = await upstream.read_body(resp, loop.time() + upstream.config.timeout_s)
        return _Reply(resp.status, json_or_none(data), session_id)


class Prober:
    """Probes one upstream: ``server/discover``, else the legacy ``initialize`` handshake.

    ``timeout_s`` bounds a whole probe (handshake and session close included), in seconds.
    """

    def __init__(self, upstream: Upstream, *, timeout_s: float) -> None:
        self.upstream = upstream
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)

    async def probe(self) -> ProbeResult:
        """Probe once; never raises (but for cancellation)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._probe()
        except TimeoutError:
            return ProbeResult(health="down", outcome="unreachable", detail=f"no answer within {self.timeout_s:g} s")
        except GatewayError as err:
            return ProbeResult(health="down", outcome="unreachable", detail=err.message)

    async def _probe(self) -> ProbeResult:
        up = self.upstream
        request_id = f"mcp-gateway-discover-{next(self._ids)}"
        body = modern_request("server/discover", request_id, {}, MODERN_VERSION)
        reply = await _exchange(up, "POST", body, modern_headers(up, "server/discover", MODERN_VERSION), request_id)
        verdict = classify_discover(reply.status, reply.message)
        if verdict is not None:
            return verdict
        code = error_code(reply.message)
        discover_detail = f"server/discover got HTTP {reply.status}" + (f" / {code}" if code is not None else "")
        return await self._handshake(discover_detail)

    async def _handshake(self, discover_detail: str) -> ProbeResult:
        """The legacy lifecycle: ``initialize``, read the result, end the session (DELETE)."""
        up = self.upstream
        request_id = f"mcp-gateway-initialize-{next(self._ids)}"
        params = {"protocolVersion": LEGACY_HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params})
        headers = up.request_headers({"Content-Type": "application/json", "Accept": _ACCEPT}, allow_authorization=False)
        reply = await _exchange(up, "POST", body, headers, request_id)
        result = classify_initialize(reply.status, reply.message, discover_detail)
        if reply.session_id is not None:
            version = result.advertised[0] if result.advertised else LEGACY_HANDSHAKE_VERSION
            await self._end_session(reply.session_id, version)
        return result

    async def _end_session(self, session_id: str, version: str) -> None:
        ours = {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": version}
        try:
            await _exchange(
                self.upstream, "DELETE", None, self.upstream.request_headers(ours, allow_authorization=False), None
            )
        except GatewayError as err:  # the session then times out on the upstream's side
            log.debug("upstream %s: ending probe session failed: %s", self.upstream.name, err.message)
