"""What the registry knows about each upstream: plain data, no I/O.

:class:`UpstreamState` per upstream inside :class:`RegistryState`. The probes
(:mod:`.probe`) and listen streams (:mod:`.listen`) write it; the routes (:mod:`.views`) and
readiness read it. A probe's verdict arrives as a :class:`ProbeResult`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..protocol import LEGACY_VERSIONS, MODERN_VERSIONS, Era

__all__ = [
    "MAX_VERSIONS",
    "Health",
    "ListenRecord",
    "ProbeRecord",
    "ProbeResult",
    "RegistryState",
    "UpstreamEra",
    "UpstreamState",
    "bounded_versions",
    "is_version",
    "newest_first",
]

#: Most protocol versions kept per upstream (advertised, and observed separately).
MAX_VERSIONS: Final = 16

_VERSION_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")

#: The era of an upstream as far as the registry knows: a request's :data:`~gateway.protocol.Era`,
#: or ``unknown`` before a probe told, or when the upstream answers neither era recognisably.
UpstreamEra = Literal[Era, "unknown"]
Health = Literal["unknown", "up", "degraded", "down"]


# -- versions ---------------------------------------------------------------------------------------


def is_version(value: str) -> bool:
    """Whether ``value`` looks like a protocol version (short, no spaces or control characters)."""
    return _VERSION_RE.match(value) is not None


def bounded_versions(value: object) -> tuple[str, ...] | None:
    """A bounded, de-duplicated tuple of well-formed version strings, or ``None`` if not a list."""
    if not isinstance(value, list):
        return None
    out: list[str] = []
    for v in value:
        if isinstance(v, str) and is_version(v) and v not in out:
            out.append(v)
        if len(out) >= MAX_VERSIONS:
            break
    return tuple(out)


def newest_first(versions: Iterable[str]) -> list[str]:
    """``versions`` without repeats, newest first."""
    # Versions are dates (YYYY-MM-DD): string order is date order.
    return sorted(set(versions), reverse=True)


# -- what probes and listen streams record ---------------------------------------------------------


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
    era: UpstreamEra | None = None
    advertised: tuple[str, ...] | None = None
    capabilities: Mapping[str, Any] | None = None
    server_info: Mapping[str, Any] | None = None
    instructions: str | None = None
    ttl_ms: int | None = None

    @property
    def reachable(self) -> bool:
        return self.health != "down"


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
    """The gateway's own listen stream to one upstream (MCP 2026-07-28, basic/patterns/subscriptions).

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


# -- the state ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class UpstreamState:
    """Everything the registry knows about one upstream (issue "Live registry", item 2).

    ``advertised``: ``supportedVersions`` from discover (legacy: the version ``initialize``
    agreed). ``observed``: versions that succeeded in real traffic through the gateway since
    the upstream last came back from ``down`` (insertion-ordered). ``server_info`` and
    ``instructions`` are self-reported, for display only (MCP 2026-07-28, basic/index, '`_meta`',
    'Per-response protocol fields', Note; server/discover, 'Data Types'). ``ttl_ms``: the last
    discover ``ttlMs``, in milliseconds. ``next_probe_at``: wall-clock seconds since the epoch.
    """

    name: str
    era: UpstreamEra = "unknown"
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
        return newest_first({*self.advertised, *self.observed})

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


class RegistryState:
    """The live state of every configured upstream, by name; read by the routes and readiness."""

    def __init__(self, names: Iterable[str]) -> None:
        self.upstreams: dict[str, UpstreamState] = {name: UpstreamState(name) for name in names}

    @property
    def ready(self) -> bool:
        """Every upstream has been probed at least once, whatever the outcome."""
        return all(s.probes > 0 for s in self.upstreams.values())

    def observe(self, upstream: str, version: str) -> None:
        """Record that ``version`` succeeded in real traffic to ``upstream`` (cheap: hot path).

        Only a version the gateway knows, or one the upstream advertised in discovery, counts:
        any caller picks the version it sends, and an upstream that answers every version would
        otherwise let callers write what they like into ``/registry/versions``.
        """
        state = self.upstreams.get(upstream)
        if state is None or version in state.observed:
            return
        known = version in MODERN_VERSIONS or version in LEGACY_VERSIONS or version in state.advertised
        if known and len(state.observed) < MAX_VERSIONS:
            state.observed[version] = None

    def aggregate(self, shown: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """``GET /registry/versions``: versions over the upstreams that are up, newest first;
        only over those ``shown(name)`` is true of, when given (per-caller policy).

        ``union``: spoken by at least one; ``intersection``: spoken by every one that is up and
        whose versions are known; ``byVersion``: version → names; ``upstreams``: every configured
        upstream with ``advertised``, ``observed``, ``era`` and ``up``. An upstream "speaks" a
        version it advertises or was observed to serve.
        """
        by_version: dict[str, list[str]] = {}
        speaking: list[set[str]] = []
        upstreams: dict[str, Any] = {}
        for name in sorted(self.upstreams):
            if shown is not None and not shown(name):
                continue
            state = self.upstreams[name]
            upstreams[name] = {
                "advertised": newest_first(state.advertised),
                "observed": newest_first(state.observed),
                "era": state.era,
                "up": state.up,
            }
            versions = set(state.versions())
            if not state.up or not versions:
                continue
            speaking.append(versions)
            for version in versions:
                by_version.setdefault(version, []).append(name)
        union = newest_first(set().union(*speaking)) if speaking else []
        common = newest_first(set.intersection(*speaking)) if speaking else []
        return {
            "union": union,
            "intersection": common,
            "byVersion": {v: by_version[v] for v in union},
            "upstreams": upstreams,
        }
