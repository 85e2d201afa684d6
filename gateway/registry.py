"""The live registry of the fleet: who each upstream is, what it offers, which versions it speaks.

Four parts, kept apart (STYLE 9, DESIGN.md "Layout"):

* **State** — :class:`UpstreamState` per upstream inside :class:`RegistryState`: plain data that
  the probes and listen streams write and the routes read. No I/O.
* **Probes** — :class:`Prober`: the gateway's own ``server/discover`` to an upstream (digest §3),
  with era detection and the legacy ``initialize`` fallback (digest §2), on a schedule from
  :func:`probe_delay` / :func:`backoff_delay` (pure functions; jitter and backoff are a MUST for
  anyone who polls, digest §5 and gotcha 21).
* **Listen streams** — :class:`Listener`: one ``subscriptions/listen`` per modern upstream that
  advertises ``listChanged`` or ``resources.subscribe``, held under the gateway's own identity;
  its notifications purge cache entries (digest §8).
* **Routes** — :class:`RegistryViews`: ``GET /v0.1/servers`` in the official MCP Registry API shape
  (live state under the ``_meta`` key :data:`LIVE_META_KEY`) and ``GET /registry/versions``.

Background tasks run through :class:`BackgroundTasks`, started and stopped from the app's
``cleanup_ctx``. Probes and listen streams go through :class:`~gateway.upstream.Upstream` (the
shared session, the upstream's configured headers, no redirects, failures mapped there) and never
carry anything from a client's request: no caller's ``Authorization`` can reach them (digest §10).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, Final, Literal

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from .auth import bearer_matches
from .cache import CacheKey, CacheStore, Clock, invalidation, uri_of
from .config import GatewayConfig, RegistryConfig
from .errors import GatewayError
from .protocol import (
    CLIENT_CAPABILITIES_KEY,
    LEGACY_VERSIONS,
    MODERN_VERSION,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    response_id_matches,
)
from .sse import SSEParser
from .telemetry import GatewayMetrics
from .upstream import Upstream

__all__ = [
    "LIVE_META_KEY",
    "BackgroundTasks",
    "Health",
    "Listener",
    "ProbeResult",
    "Prober",
    "Registry",
    "RegistryState",
    "RegistryViews",
    "UpstreamState",
    "backoff_delay",
    "classify_discover",
    "classify_initialize",
    "probe_delay",
]

log = logging.getLogger("mcp_gateway.registry")

#: Our own ``_meta`` key for the live state in ``/v0.1/servers``. Its second label is neither
#: ``modelcontextprotocol`` nor ``mcp``, so the prefix is not reserved (digest §1, key grammar).
LIVE_META_KEY: Final = "io.github.mcp-gateway/live"
CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY: Final = "io.modelcontextprotocol/subscriptionId"
#: The version the legacy ``initialize`` fallback asks for (the newest legacy revision).
LEGACY_HANDSHAKE_VERSION: Final = "2025-11-25"

#: Probes of a healthy upstream come up to this fraction early (never late), so a fleet
#: started at once does not stay in lock-step.
PROBE_JITTER: Final = 0.2
#: Delay before re-subscribing after an upstream ended a listen stream gracefully, in seconds.
RESUBSCRIBE_AFTER_GRACEFUL_S: Final = 1.0
#: How often a held listen stream is checked against what should be subscribed, in seconds.
LISTEN_RESYNC_S: Final = 2.0
#: Most resource URIs one listen stream subscribes to (``resourceSubscriptions``).
MAX_RESOURCE_SUBSCRIPTIONS: Final = 256
#: Most protocol versions kept per upstream (advertised, and observed separately).
MAX_VERSIONS: Final = 16
#: Longest ``instructions`` kept for display, in characters.
MAX_INSTRUCTIONS_CHARS: Final = 8192
DEFAULT_PAGE_LIMIT: Final = 30
MAX_PAGE_LIMIT: Final = 100
#: ``server.json`` limits its ``description`` to 100 characters.
MAX_DESCRIPTION_CHARS: Final = 100

_VERSION_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
_MODERN_ERRORS: Final = frozenset({-32020, -32021, -32022})
_UNSUPPORTED_VERSION: Final = -32022
_ACCEPT: Final = "application/json, text/event-stream"

Health = Literal["unknown", "up", "degraded", "down"]
Era = Literal["modern", "legacy", "unknown"]
Rng = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


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

    The discover result's ``ttlMs`` (milliseconds; ``None`` or absent means 0, digest §5) is
    clamped to ``[min_s, max_s]`` seconds, then brought forward by up to :data:`PROBE_JITTER`
    of itself: the result lies in ``(base * (1 - PROBE_JITTER), base]``. ``rng()`` returns a
    float in ``[0, 1)``. TTL is never used as the polling interval unbounded (gotcha 21).
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


# -- probe verdicts (pure) --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one probe learnt. ``era`` ``None`` leaves the known era as it was (unreachable).

    ``outcome`` is one of ``modern``, ``legacy``, ``unsupported-version``, ``rejected``,
    ``unrecognised``, ``unauthorized``, ``unreachable``; ``ttl_ms`` is the discover result's
    ``ttlMs`` in milliseconds (``None`` for legacy or when absent).
    """

    health: Health
    outcome: str
    detail: str | None = None
    era: Era | None = None
    advertised: tuple[str, ...] | None = None
    capabilities: Mapping[str, Any] | None = None
    server_info: Mapping[str, Any] | None = None
    instructions: str | None = None
    ttl_ms: int | None = None

    @property
    def reachable(self) -> bool:
        return self.health != "down"


def _versions(value: object) -> tuple[str, ...] | None:
    """A bounded, de-duplicated tuple of well-formed version strings, or ``None`` if not a list."""
    if not isinstance(value, list):
        return None
    out: list[str] = []
    for v in value:
        if isinstance(v, str) and _VERSION_RE.match(v) and v not in out:
            out.append(v)
        if len(out) >= MAX_VERSIONS:
            break
    return tuple(out)


def _server_info(value: object) -> Mapping[str, Any] | None:
    """The display fields of a self-reported ``Implementation`` (never used for decisions)."""
    if not isinstance(value, dict):
        return None
    keep = ("name", "title", "version", "description", "websiteUrl")
    info = {k: value[k][:1024] for k in keep if isinstance(value.get(k), str)}
    return info or None


def _instructions(value: object) -> str | None:
    return value[:MAX_INSTRUCTIONS_CHARS] if isinstance(value, str) else None


def _error_code(message: object) -> int | None:
    if isinstance(message, dict) and isinstance(err := message.get("error"), dict):
        code = err.get("code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    return None


def classify_discover(status: int, message: object) -> ProbeResult | None:
    """Judge the answer to the gateway's ``server/discover`` (digest §2 "Legacy detection", §3).

    ``message`` is the JSON-RPC response to the probe (``None`` when the body held none).
    Returns ``None`` when the upstream looks legacy (any other JSON-RPC error, a bare 4xx,
    something that is not a ``DiscoverResult``): the caller then tries ``initialize``.

    * a ``DiscoverResult`` → modern, up;
    * ``-32022`` → modern, ``data.supported`` recorded; degraded unless it names a version
      this gateway speaks;
    * ``-32020``/``-32021`` → modern (recognised modern errors: no fallback), degraded;
    * HTTP 5xx → down (no era signal); 401/403 → down (the configured headers are wrong).
    """
    code = _error_code(message)
    if code == _UNSUPPORTED_VERSION:
        err = message["error"] if isinstance(message, dict) else {}
        data = err.get("data") if isinstance(err, dict) else None
        supported = _versions(data.get("supported") if isinstance(data, dict) else None) or ()
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
    advertised = _versions(result.get("supportedVersions"))
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
    if status == 200 and isinstance(result, dict) and isinstance(version, str) and _VERSION_RE.match(version):
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
    code = _error_code(message)
    got = f"JSON-RPC error {code}" if code is not None else f"HTTP {status}"
    return ProbeResult(
        health="degraded",
        outcome="unrecognised",
        detail=f"neither era answered: {discover_detail}; initialize got {got}",
        era="unknown",
    )


# -- state ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ProbeRecord:
    """The last probe: when (``at``, wall-clock seconds since the epoch), how long
    (``duration_ms``, milliseconds), ``outcome`` (see :class:`ProbeResult`) and ``detail``."""

    at: float
    duration_ms: float
    outcome: str
    detail: str | None


@dataclass(slots=True)
class ListenRecord:
    """The gateway's own ``subscriptions/listen`` to one upstream (digest §8).

    ``state``: ``off`` (not wanted: legacy, down, or nothing to listen for), ``connecting``,
    ``acknowledged`` (held), ``retrying`` (lost or refused, waiting with backoff).
    ``requested``/``honoured``: the filter sent and the one the acknowledgement echoed.
    ``problem``: why the stream is not held, while it is not. ``streams``: streams opened;
    ``losses``: streams that ended without the graceful result.
    """

    state: Literal["off", "connecting", "acknowledged", "retrying"] = "off"
    requested: Mapping[str, Any] | None = None
    honoured: Mapping[str, Any] | None = None
    problem: str | None = None
    streams: int = 0
    losses: int = 0


@dataclass(slots=True)
class UpstreamState:
    """Everything the registry knows about one upstream (issue "Live registry", item 2).

    ``advertised``: ``supportedVersions`` from discover (legacy: the version ``initialize``
    agreed). ``observed``: versions that succeeded in real traffic through the gateway since
    the upstream last came back from ``down`` (insertion-ordered). ``server_info`` and
    ``instructions`` are self-reported, for display only (digest §1). ``ttl_ms``: the last
    discover ``ttlMs``, in milliseconds. ``next_probe_at``: wall-clock seconds since the epoch.
    """

    name: str
    era: Era = "unknown"
    advertised: tuple[str, ...] = ()
    observed: dict[str, None] = field(default_factory=dict)
    capabilities: Mapping[str, Any] | None = None
    server_info: Mapping[str, Any] | None = None
    instructions: str | None = None
    ttl_ms: int | None = None
    probe_health: Health = "unknown"
    probe_detail: str | None = "not probed yet"
    probes: int = 0
    last_probe: ProbeRecord | None = None
    next_probe_at: float | None = None
    listen: ListenRecord = field(default_factory=ListenRecord)

    @property
    def health(self) -> tuple[Health, str | None]:
        """``(status, reason)``: the probe's verdict, lowered to ``degraded`` while a wanted
        listen stream is not held (the cache then relies on TTL alone)."""
        if self.probe_health == "up" and self.listen.problem is not None and self.listen.state != "off":
            return "degraded", f"subscriptions/listen not held: {self.listen.problem}"
        return self.probe_health, self.probe_detail

    @property
    def up(self) -> bool:
        """Reachable and answering: health ``up`` or ``degraded``."""
        return self.probe_health in ("up", "degraded")

    @property
    def dual_era(self) -> bool:
        """A modern upstream that also advertises a legacy version."""
        return self.era == "modern" and any(v in LEGACY_VERSIONS for v in self.advertised)

    def versions(self) -> list[str]:
        """Advertised and observed versions, newest first."""
        return _newest_first({*self.advertised, *self.observed})

    def apply(self, result: ProbeResult, record: ProbeRecord) -> None:
        """Record one probe's result."""
        if result.reachable and self.probe_health == "down":
            self.observed.clear()  # back after being down: maybe a different build
        self.probes += 1
        self.last_probe = record
        self.probe_health = result.health
        self.probe_detail = result.detail
        if result.era is not None:
            self.era = result.era
        if result.advertised is not None:
            self.advertised = result.advertised
        if result.outcome in ("modern", "legacy"):
            self.capabilities = result.capabilities
            self.server_info = result.server_info
            self.instructions = result.instructions
            self.ttl_ms = result.ttl_ms
        elif result.reachable:
            self.capabilities = None
            self.ttl_ms = None


def _newest_first(versions: Iterable[str]) -> list[str]:
    # Versions are dates (YYYY-MM-DD): string order is date order.
    return sorted(set(versions), reverse=True)


class RegistryState:
    """The live state of every configured upstream, by name; read by the routes and readiness."""

    def __init__(self, names: Iterable[str]) -> None:
        self.upstreams: dict[str, UpstreamState] = {name: UpstreamState(name) for name in names}

    @property
    def ready(self) -> bool:
        """Every upstream has been probed at least once, whatever the outcome."""
        return all(s.probes > 0 for s in self.upstreams.values())

    def observe(self, upstream: str, version: str) -> None:
        """Record that ``version`` succeeded in real traffic to ``upstream`` (cheap: hot path)."""
        state = self.upstreams.get(upstream)
        if state is None or version in state.observed:
            return
        if len(state.observed) < MAX_VERSIONS and _VERSION_RE.match(version):
            state.observed[version] = None

    def aggregate(self) -> dict[str, Any]:
        """``GET /registry/versions``: versions over the upstreams that are up, newest first.

        ``union``: spoken by at least one; ``intersection``: spoken by every one that is up and
        whose versions are known; ``byVersion``: version → names; ``upstreams``: every configured
        upstream with ``advertised``, ``observed``, ``era`` and ``up``. An upstream "speaks" a
        version it advertises or was observed to serve.
        """
        by_version: dict[str, list[str]] = {}
        speaking: list[set[str]] = []
        upstreams: dict[str, Any] = {}
        for name in sorted(self.upstreams):
            state = self.upstreams[name]
            upstreams[name] = {
                "advertised": _newest_first(state.advertised),
                "observed": _newest_first(state.observed),
                "era": state.era,
                "up": state.up,
            }
            versions = set(state.versions())
            if not state.up or not versions:
                continue
            speaking.append(versions)
            for version in versions:
                by_version.setdefault(version, []).append(name)
        union = _newest_first(set().union(*speaking)) if speaking else []
        common = _newest_first(set.intersection(*speaking)) if speaking else []
        return {
            "union": union,
            "intersection": common,
            "byVersion": {v: by_version[v] for v in union},
            "upstreams": upstreams,
        }


# -- background tasks ---------------------------------------------------------------------------------


class BackgroundTasks:
    """Owns the gateway's background tasks (STYLE 9).

    The event loop keeps only weak references to tasks, so this keeps strong ones until each
    task ends; :meth:`close` cancels every task and awaits them all. A task that dies of an
    unexpected exception is logged, never silently lost.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task %s died", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()


async def _pause(sleep: Sleep, delay: float, wake: asyncio.Event | None = None) -> None:
    """Sleep ``delay`` seconds through ``sleep``, ending early when ``wake`` is set."""
    if wake is None:
        await sleep(delay)
        return
    sleeper = asyncio.ensure_future(sleep(delay))
    waker = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in (sleeper, waker):
            fut.cancel()
        await asyncio.gather(sleeper, waker, return_exceptions=True)


# -- talking to an upstream ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    message: object
    session_id: str | None


def _request(method: str, request_id: str, params: Mapping[str, Any], version: str) -> bytes:
    meta = {PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: {}, CLIENT_INFO_KEY: CLIENT_INFO}
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}})


def _modern_headers(upstream: Upstream, method: str, version: str) -> CIMultiDict[str]:
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
    body (digest gotcha 7). Bounded by the caller's timeout and ``max_response_bytes``.

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
                    message = _loads(data)
                    if response_id_matches(message, request_id):
                        return _Reply(resp.status, message, session_id)
                if parser.overflowed:
                    break
            return _Reply(resp.status, None, session_id)
        data = await upstream.read_body(resp, loop.time() + upstream.config.timeout_s)
        return _Reply(resp.status, _loads(data), session_id)


def _loads(data: bytes) -> object:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


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
        body = _request("server/discover", request_id, {}, MODERN_VERSION)
        reply = await _exchange(up, "POST", body, _modern_headers(up, "server/discover", MODERN_VERSION), request_id)
        verdict = classify_discover(reply.status, reply.message)
        if verdict is not None:
            return verdict
        code = _error_code(reply.message)
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


# -- listen streams -----------------------------------------------------------------------------------


class _Stream:
    """One ``subscriptions/listen`` request and its SSE answer, run as a task.

    ``outcome`` once done: ``graceful`` (the listen result came, digest §8), ``lost`` (acknowledged,
    then ended without the result), ``refused`` (never acknowledged), ``closed`` (we cancelled it).
    """

    def __init__(self, listener: Listener, filt: Mapping[str, Any], request_id: str) -> None:
        self.listener = listener
        self.filter = filt
        self.request_id = request_id
        self.acked = asyncio.Event()
        self.honoured: Mapping[str, Any] | None = None
        self.outcome = "closed"
        self.detail: str | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        lis = self.listener
        up = lis.upstream
        body = _request("subscriptions/listen", self.request_id, {"notifications": dict(self.filter)}, lis.version)
        headers = _modern_headers(up, "subscriptions/listen", lis.version)
        try:
            async with asyncio.timeout(lis.ack_timeout_s) as deadline:
                async with up.open("POST", body, headers) as resp:
                    await self._read(resp, deadline)
        except TimeoutError:
            self._end("refused", f"no acknowledgement within {lis.ack_timeout_s:g} s")
        except GatewayError as err:
            self._end("lost", err.message)
        except asyncio.CancelledError:
            self._end("closed", None)
            raise
        except Exception as exc:  # a bug here must read as a broken stream, never end silently
            log.exception("upstream %s: listen stream failed", up.name)
            self._end("lost", f"listen stream failed ({type(exc).__name__})")

    def _end(self, outcome: str, detail: str | None) -> None:
        if outcome == "lost" and not self.acked.is_set():
            outcome = "refused"
        self.outcome, self.detail = outcome, detail

    async def _read(self, resp: aiohttp.ClientResponse, deadline: asyncio.Timeout) -> None:
        up = self.listener.upstream
        if resp.status != 200 or resp.content_type != "text/event-stream":
            loop = asyncio.get_running_loop()
            code = _error_code(_loads(await up.read_body(resp, loop.time() + up.config.timeout_s)))
            got = f"JSON-RPC error {code}" if code is not None else f"{resp.content_type} body"
            self._end("refused", f"answered HTTP {resp.status} with {got}, not an event stream")
            return
        parser = SSEParser(up.config.max_response_bytes)
        async for chunk in up.iter_stream(resp):
            for data in parser.feed(chunk):
                if self._handle(_loads(data), deadline):
                    return
            if parser.overflowed:
                self._end("lost", "an event exceeded max_response_bytes")
                return
        self._end("lost", "the stream ended without the subscriptions/listen result")

    def _handle(self, message: object, deadline: asyncio.Timeout) -> bool:
        """Act on one message; ``True`` when the stream is over."""
        if not isinstance(message, dict):
            return False
        method = message.get("method")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        meta = params.get("_meta")
        sub_id = meta.get(SUBSCRIPTION_ID_KEY) if isinstance(meta, dict) else None
        if not self.acked.is_set():
            if method == "notifications/subscriptions/acknowledged" and sub_id == self.request_id:
                honoured = params.get("notifications")
                self.honoured = honoured if isinstance(honoured, dict) else {}
                deadline.reschedule(None)  # acknowledged: from now on only the idle timeout applies
                self.acked.set()
                return False
            self._end("refused", f"first message was {method or 'a response'}, not the acknowledgement")
            return True
        if method is None:
            if response_id_matches(message, self.request_id):
                if "result" in message:
                    self._end("graceful", None)
                else:
                    self._end("lost", f"ended with JSON-RPC error {_error_code(message)}")
                return True
            return False
        if isinstance(method, str) and (sub_id is None or sub_id == self.request_id):
            self.listener.notified(method, params)
        return False


class Listener:
    """Holds the gateway's own ``subscriptions/listen`` to one modern upstream (digest §8).

    The filter comes from the last discover: ``toolsListChanged``/``promptsListChanged``/
    ``resourcesListChanged`` where the capability advertises ``listChanged``, and
    ``resourceSubscriptions`` for the URIs of this upstream's cached ``resources/read`` entries
    where ``resources.subscribe`` is advertised. When more URIs get cached, a wider stream is
    opened and, once acknowledged, replaces the old one (no gap). When a stream ends without the
    graceful result, all of this upstream's entries are purged (reason ``stream_lost``):
    notifications may have been missed, and there is no replay. Entries stored while no stream
    was held after such a break are purged again when the next stream is acknowledged.
    Re-subscribing after failures backs off exponentially with jitter.
    """

    def __init__(
        self,
        upstream: Upstream,
        state: UpstreamState,
        settings: RegistryConfig,
        *,
        purge: Callable[[Callable[[CacheKey], bool], str], int],
        cached_uris: Callable[[str], tuple[str, ...]],
        sleep: Sleep,
        rng: Rng,
    ) -> None:
        self.upstream = upstream
        self.state = state
        self.settings = settings
        self.ack_timeout_s = settings.probe_timeout_s
        self.version = MODERN_VERSION
        self.wake = asyncio.Event()
        self._purge = purge
        self._cached_uris = cached_uris
        self._sleep = sleep
        self._rng = rng
        self._ids = itertools.count(1)
        self._active: _Stream | None = None
        self._failures = 0
        self._covered = True  # False after a break, until a stream is acknowledged again

    def desired_filter(self) -> dict[str, Any] | None:
        """The ``SubscriptionFilter`` to hold now, or ``None`` when no stream is wanted."""
        state = self.state
        caps = state.capabilities
        if state.era != "modern" or not state.up or not isinstance(caps, Mapping):
            return None
        if not any(v in MODERN_VERSIONS for v in state.advertised):
            return None
        filt: dict[str, Any] = {}
        for cap, flag in (("tools", "toolsListChanged"), ("prompts", "promptsListChanged")):
            section = caps.get(cap)
            if isinstance(section, Mapping) and section.get("listChanged") is True:
                filt[flag] = True
        resources = caps.get("resources")
        if isinstance(resources, Mapping):
            if resources.get("listChanged") is True:
                filt["resourcesListChanged"] = True
            if resources.get("subscribe") is True and (uris := self._cached_uris(self.upstream.name)):
                filt["resourceSubscriptions"] = list(uris)
        return filt or None

    def notified(self, method: str, params: Mapping[str, Any]) -> None:
        """A notification arrived on the held stream: purge what it makes stale."""
        predicate = invalidation(self.upstream.name, method, params)
        if predicate is not None:
            count = self._purge(predicate, "notification")
            log.info("upstream %s: %s purged %d cache entries", self.upstream.name, method, count)

    @staticmethod
    def _covers(held: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
        """Whether the held filter asks for everything ``wanted`` asks for."""
        for flag, value in wanted.items():
            if flag == "resourceSubscriptions":
                if not set(value) <= set(held.get(flag, ())):
                    return False
            elif held.get(flag) != value:
                return False
        return True

    async def run(self) -> None:
        """Hold the stream until cancelled. Every wait is bounded (:data:`LISTEN_RESYNC_S`)."""
        try:
            while True:
                try:
                    await self._step()
                except Exception:  # a bug must not end invalidation for good: log, back off, go on
                    log.exception("upstream %s: listen supervisor failed", self.upstream.name)
                    self._failures += 1
                    await _pause(self._sleep, self._backoff())
        finally:
            if self._active is not None:
                await self._close(self._active)
                self._active = None

    async def _step(self) -> None:
        active = self._active
        if active is not None and active.task is not None and active.task.done():
            self._active = None
            await self._ended(active)
            return
        wanted = self.desired_filter()
        listen = self.state.listen
        if wanted is None:
            if active is not None:
                await self._close(active)
                self._active = None
                self._covered = False
            listen.state, listen.requested, listen.honoured, listen.problem = "off", None, None, None
            await self._wait(LISTEN_RESYNC_S)
            return
        if active is None or not self._covers(active.filter, wanted):
            await self._open(wanted)
            return
        await self._wait(LISTEN_RESYNC_S, active)

    async def _wait(self, within_s: float, active: _Stream | None = None) -> None:
        """Until ``within_s`` seconds pass, the registry wakes us, or ``active`` ends."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.wake.wait())]
        if active is not None and active.task is not None:
            waits.append(active.task)
        try:
            await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waits[0].cancel()
            await asyncio.gather(waits[0], return_exceptions=True)
        self.wake.clear()

    async def _open(self, wanted: Mapping[str, Any]) -> None:
        """Open a stream for ``wanted``; once acknowledged it replaces the held one (if any)."""
        listen = self.state.listen
        old = self._active
        stream = _Stream(self, wanted, f"mcp-gateway-listen-{next(self._ids)}")
        stream.task = asyncio.ensure_future(stream.run())
        listen.streams += 1
        if old is None:
            listen.state, listen.requested = "connecting", dict(wanted)
        ack = asyncio.ensure_future(stream.acked.wait())
        try:
            await asyncio.wait((ack, stream.task), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._close(stream)  # not yet ours to close in run()'s finally
            raise
        finally:
            ack.cancel()
            await asyncio.gather(ack, return_exceptions=True)
        if not stream.acked.is_set():
            await stream.task  # it ended without an acknowledgement
            await self._ended(stream, replacing=old is not None)
            return
        self._active = stream
        if old is not None:
            await self._close(old)
        listen.state, listen.requested, listen.honoured, listen.problem = (
            "acknowledged",
            dict(wanted),
            stream.honoured,
            None,
        )
        self._failures = 0
        if not self._covered:
            # Entries stored since the break may have missed a notification.
            self._purge(lambda k: k.upstream == self.upstream.name, "stream_lost")
            self._covered = True
        log.info("upstream %s: listening for %s (acknowledged %s)", self.upstream.name, dict(wanted), stream.honoured)

    async def _close(self, stream: _Stream) -> None:
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
            await asyncio.gather(stream.task, return_exceptions=True)

    async def _ended(self, stream: _Stream, *, replacing: bool = False) -> None:
        """A stream ended on its own: purge if it was lost, then wait before re-subscribing."""
        listen = self.state.listen
        if stream.outcome == "graceful":
            log.info("upstream %s: listen stream ended gracefully; re-subscribing", self.upstream.name)
            listen.state = "retrying"
            await _pause(self._sleep, RESUBSCRIBE_AFTER_GRACEFUL_S)
            return
        self._failures += 1
        if stream.outcome == "lost":
            listen.losses += 1
            self._covered = False
            count = self._purge(lambda k: k.upstream == self.upstream.name, "stream_lost")
            log.warning(
                "upstream %s: listen stream lost (%s); purged %d entries", self.upstream.name, stream.detail, count
            )
        else:
            log.warning("upstream %s: subscriptions/listen refused: %s", self.upstream.name, stream.detail)
        if not replacing:
            listen.state, listen.problem = "retrying", stream.detail or stream.outcome
        await _pause(self._sleep, self._backoff(), self.wake)
        self.wake.clear()

    def _backoff(self) -> float:
        settings = self.settings
        return backoff_delay(
            self._failures, base_s=settings.backoff_base_s, max_s=settings.backoff_max_s, rng=self._rng
        )


# -- the registry service ----------------------------------------------------------------------------


class Registry:
    """The registry service: state, and (with a ``[registry]`` table) the probe and listen tasks.

    ``clock`` is monotonic seconds (the cache's clock); ``wall_clock`` gives seconds since the
    epoch for the times shown in the routes; ``rng()`` a float in ``[0, 1)`` for jitter;
    ``sleep(seconds)`` the pause between probes (tests inject all four).
    """

    def __init__(
        self,
        config: GatewayConfig,
        store: CacheStore,
        metrics: GatewayMetrics,
        *,
        clock: Clock,
        rng: Rng,
        sleep: Sleep,
        wall_clock: Clock = time.time,
    ) -> None:
        self.config = config
        self.settings = config.registry if config.registry.enabled else None
        self.state = RegistryState(config.upstreams)
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.rng = rng
        self.sleep = sleep
        self.tasks = BackgroundTasks()
        self.probers: dict[str, Prober] = {}
        self.listeners: dict[str, Listener] = {}
        self._uris: dict[str, tuple[str, ...]] = {}
        self._uris_at: float | None = None
        self._versions_labelled: dict[str, set[str]] = {}

    @property
    def ready(self) -> bool:
        """Probing is off, or every upstream has been probed once."""
        return self.settings is None or self.state.ready

    def observe(self, upstream: str, version: str) -> None:
        """The proxy's ``on_success`` hook: ``version`` worked for ``upstream`` in real traffic."""
        self.state.observe(upstream, version)

    # -- lifecycle (called from the app's cleanup_ctx) --

    def start(self, upstreams: Mapping[str, Upstream]) -> None:
        """Start one probe loop and one listener per upstream (no-op without ``[registry]``)."""
        settings = self.settings
        if settings is None:
            return
        for name, upstream in upstreams.items():
            state = self.state.upstreams[name]
            self.probers[name] = Prober(upstream, timeout_s=settings.probe_timeout_s)
            self.tasks.spawn(self._probe_loop(name), name=f"probe:{name}")
            if settings.listen:
                listener = Listener(
                    upstream,
                    state,
                    settings,
                    purge=self.purge,
                    cached_uris=self.cached_uris,
                    sleep=self.sleep,
                    rng=self.rng,
                )
                self.listeners[name] = listener
                self.tasks.spawn(listener.run(), name=f"listen:{name}")

    async def stop(self) -> None:
        """Cancel every probe and listen stream and wait for them."""
        await self.tasks.close()

    # -- probing --

    async def probe(self, name: str) -> ProbeResult:
        """Probe ``name`` once now and record the result (also used by tests)."""
        started = time.perf_counter()
        at = self.wall_clock()
        result = await self.probers[name].probe()
        state = self.state.upstreams[name]
        was = state.health[0]
        before = (state.probe_health, state.era, state.capabilities)
        state.apply(
            result, ProbeRecord(at, round((time.perf_counter() - started) * 1000, 3), result.outcome, result.detail)
        )
        self._export(name, state)
        now = state.health[0]
        if now != was:
            level = logging.WARNING if now in ("down", "degraded") else logging.INFO
            log.log(level, "upstream %s is %s (%s era): %s", name, now, state.era, state.health[1] or result.outcome)
        listener = self.listeners.get(name)
        if listener is not None and result.reachable and before != (state.probe_health, state.era, state.capabilities):
            # Back, or changed: reconsider the stream now rather than after the listen backoff.
            listener.wake.set()
        return result

    async def _probe_loop(self, name: str) -> None:
        settings = self.settings
        assert settings is not None
        failures = 0
        while True:
            try:
                result = await self.probe(name)
            except Exception:  # a bug must not stop probing for good: log it and count a failure
                log.exception("upstream %s: probe failed", name)
                result = ProbeResult(health="down", outcome="unreachable", detail="probe failed (see the log)")
            if result.reachable:
                failures = 0
                delay = probe_delay(
                    result.ttl_ms,
                    min_s=settings.probe_min_interval_s,
                    max_s=settings.probe_max_interval_s,
                    rng=self.rng,
                )
            else:
                failures += 1
                delay = backoff_delay(
                    failures, base_s=settings.backoff_base_s, max_s=settings.backoff_max_s, rng=self.rng
                )
            self.state.upstreams[name].next_probe_at = self.wall_clock() + delay
            await self.sleep(delay)

    def _export(self, name: str, state: UpstreamState) -> None:
        """``upstream_up`` and ``upstream_supported_version`` (stale version labels removed)."""
        self.metrics.upstream_up.labels(name).set(1 if state.up else 0)
        current = set(state.advertised)
        for version in self._versions_labelled.get(name, set()) - current:
            self.metrics.upstream_supported_version.remove(name, version)
        for version in current:
            self.metrics.upstream_supported_version.labels(name, version).set(1)
        self._versions_labelled[name] = current

    # -- the cache --

    def purge(self, predicate: Callable[[CacheKey], bool], reason: str) -> int:
        """Remove matching cache entries (counted under ``cache_evictions{reason}``)."""
        count = self.store.purge(predicate, reason)
        if count:
            self.metrics.cache_entries.set(len(self.store))
            self.metrics.cache_bytes.set(self.store.total_bytes)
        return count

    def cached_uris(self, upstream: str) -> tuple[str, ...]:
        """URIs of ``upstream``'s cached ``resources/read`` entries, sorted, at most
        :data:`MAX_RESOURCE_SUBSCRIPTIONS`; rescanned at most every :data:`LISTEN_RESYNC_S` seconds."""
        now = self.clock()
        if self._uris_at is None or now - self._uris_at >= LISTEN_RESYNC_S:
            self._uris_at = now
            found: dict[str, set[str]] = {}
            for key in self.store.keys():
                if key.method == "resources/read":
                    uri = uri_of(key)
                    if isinstance(uri, str):
                        found.setdefault(key.upstream, set()).add(uri)
            self._uris = {name: tuple(sorted(uris)[:MAX_RESOURCE_SUBSCRIPTIONS]) for name, uris in found.items()}
        return self._uris.get(upstream, ())


# -- routes --------------------------------------------------------------------------------------------


def _rfc3339(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json(payload: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload), status=status, headers={"Content-Type": "application/json", **(headers or {})}
    )


class RegistryViews:
    """``GET /v0.1/servers``, ``/v0.1/servers/{name}/versions[/{version}]`` and ``/registry/versions``.

    The ``/v0.1`` routes follow the official MCP Registry API (``ServerList``: ``servers[]`` of
    ``{server, _meta}`` and ``metadata`` ``{nextCursor?, count}``; ``server`` is a ``server.json``
    with one ``streamable-http`` remote pointing at the gateway). Names are
    ``<server_namespace>/<upstream name>``; the bare upstream name is accepted in paths too.
    When ``[auth]`` is configured these routes need one of its bearer tokens (401 otherwise).
    """

    def __init__(self, config: GatewayConfig, state: RegistryState) -> None:
        self.config = config
        self.state = state
        settings = config.registry
        self.namespace = settings.server_namespace
        self.base_url = str(settings.public_base_url).rstrip("/") if settings.public_base_url else None
        self._tokens = tuple(t.encode() for t in config.auth.tokens) if config.auth else ()

    def _denied(self, request: web.Request) -> web.Response | None:
        if not self._tokens:
            return None
        if bearer_matches(request.headers.get("Authorization"), self._tokens):
            return None
        return _json(
            {"error": "a valid bearer token is required"}, 401, {"WWW-Authenticate": 'Bearer realm="mcp-gateway"'}
        )

    def _base(self, request: web.Request) -> str:
        return self.base_url or str(request.url.origin())

    def server_name(self, upstream: str) -> str:
        return f"{self.namespace}/{upstream}"

    def _lookup(self, name: str) -> UpstreamState | None:
        prefix = f"{self.namespace}/"
        return self.state.upstreams.get(name.removeprefix(prefix) if name.startswith(prefix) else name)

    def entry(self, state: UpstreamState, base: str) -> dict[str, Any]:
        """One ``ServerResponse``: ``{"server": server.json, "_meta": {LIVE_META_KEY: live state}}``."""
        info = state.server_info or {}
        url = f"{base}/servers/{state.name}/mcp"
        description = info.get("description") or f"MCP server '{state.name}' behind this gateway"
        server: dict[str, Any] = {
            "name": self.server_name(state.name),
            "description": description[:MAX_DESCRIPTION_CHARS],
            "version": info.get("version") or "unknown",
            "remotes": [{"type": "streamable-http", "url": url}],
        }
        if isinstance(info.get("title"), str):
            server["title"] = info["title"][:MAX_DESCRIPTION_CHARS]
        if isinstance(info.get("websiteUrl"), str):
            server["websiteUrl"] = info["websiteUrl"]
        health, reason = state.health
        listen = state.listen
        probe = state.last_probe
        live = {
            "upstream": state.name,
            "url": url,
            "era": state.era,
            "dualEra": state.dual_era,
            "supportedVersions": list(state.advertised),
            "observedVersions": _newest_first(state.observed),
            "capabilities": state.capabilities,
            "serverInfo": state.server_info,
            "instructions": state.instructions,
            "health": {"status": health, "reason": reason, "up": state.up},
            "lastProbe": None
            if probe is None
            else {
                "at": _rfc3339(probe.at),
                "outcome": probe.outcome,
                "detail": probe.detail,
                "durationMs": probe.duration_ms,
            },
            "probes": state.probes,
            "nextProbeAt": _rfc3339(state.next_probe_at),
            "ttlMs": state.ttl_ms,
            "listen": {
                "state": listen.state,
                "requested": listen.requested,
                "honoured": listen.honoured,
                "problem": listen.problem,
                "streams": listen.streams,
                "losses": listen.losses,
            },
        }
        return {"server": server, "_meta": {LIVE_META_KEY: live}}

    async def servers(self, request: web.Request) -> web.Response:
        """``GET /v0.1/servers?cursor=&limit=&search=&version=``; ``cursor`` is the last name of
        the previous page (opaque to callers), ``limit`` 1-100 (default 30), ``search`` a
        case-insensitive substring of the name, ``version`` ``latest`` or an exact version."""
        if (denied := self._denied(request)) is not None:
            return denied
        raw_limit = request.query.get("limit", str(DEFAULT_PAGE_LIMIT))
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            return _json({"error": f"limit must be an integer from 1 to {MAX_PAGE_LIMIT}"}, 400)
        cursor = request.query.get("cursor") or ""
        search = (request.query.get("search") or "").lower()
        version = request.query.get("version")
        base = self._base(request)
        entries = []
        for upstream in sorted(self.state.upstreams):
            name = self.server_name(upstream)
            if name <= cursor or (search and search not in name.lower()):
                continue
            entry = self.entry(self.state.upstreams[upstream], base)
            if version not in (None, "", "latest") and entry["server"]["version"] != version:
                continue
            entries.append(entry)
        page = entries[:limit]
        meta: dict[str, Any] = {"count": len(page)}
        if len(entries) > limit:
            meta["nextCursor"] = page[-1]["server"]["name"]
        return _json({"servers": page, "metadata": meta})

    async def server_versions(self, request: web.Request) -> web.Response:
        """``GET /v0.1/servers/{name}/versions``: a ``ServerList`` of the one live version."""
        if (denied := self._denied(request)) is not None:
            return denied
        state = self._lookup(request.match_info["name"])
        if state is None:
            return _json({"error": "Server not found"}, 404)
        return _json({"servers": [self.entry(state, self._base(request))], "metadata": {"count": 1}})

    async def server_version(self, request: web.Request) -> web.Response:
        """``GET /v0.1/servers/{name}/versions/{version}``: ``latest`` or the live version; 404 JSON otherwise."""
        if (denied := self._denied(request)) is not None:
            return denied
        state = self._lookup(request.match_info["name"])
        if state is None:
            return _json({"error": "Server not found"}, 404)
        entry = self.entry(state, self._base(request))
        if request.match_info["version"] not in ("latest", entry["server"]["version"]):
            return _json({"error": "Server version not found"}, 404)
        return _json(entry)

    async def versions(self, request: web.Request) -> web.Response:
        """``GET /registry/versions``: see :meth:`RegistryState.aggregate`."""
        if (denied := self._denied(request)) is not None:
            return denied
        return _json(self.state.aggregate())
