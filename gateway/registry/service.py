"""The registry service: the state, and with a ``[registry]`` table the probe and listen tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Mapping
from typing import Final

from ..cache import CacheStore, Clock, Invalidation, uri_of
from ..cluster import Cluster, Invalidator, Unavailable
from ..cluster.lease import Leases
from ..config import GatewayConfig
from ..tasks import BackgroundTasks
from ..telemetry import GatewayMetrics
from ..upstream import Upstream
from .listen import LISTEN_RESYNC_S, ListenStream, Sleep
from .probe import Prober, Rng, backoff_delay, probe_delay
from .shared import MIRROR_S, RegistryMirror
from .state import ProbeRecord, ProbeResult, RegistryState, UpstreamState

__all__ = ["MAX_RESOURCE_SUBSCRIPTIONS", "Registry"]

log = logging.getLogger("mcp_gateway.registry")

#: Most resource URIs one listen stream subscribes to (``resourceSubscriptions``).
MAX_RESOURCE_SUBSCRIPTIONS: Final = 256


class Registry:
    """The registry service: state, and (with a ``[registry]`` table) the probe and listen tasks.

    ``clock`` is monotonic seconds (the cache's clock); ``wall_clock`` gives seconds since the
    epoch for the times shown in the routes; ``rng()`` a float in ``[0, 1)`` for jitter;
    ``sleep(seconds)`` every pause of the probe loops and listen streams (tests inject all four).
    The tasks start in :meth:`start` and stop in :meth:`stop`, both called from the app's
    ``cleanup_ctx``. With a ``cluster``, an upstream is probed and listened to only by the
    process holding its lease, and the others copy its state (:mod:`.shared`). The cache
    entries a notification makes stale go through ``invalidator`` (every worker and replica).
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
        invalidator: Invalidator,
        wall_clock: Clock = time.time,
        cluster: Cluster | None = None,
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
        self.tasks = BackgroundTasks(log)
        self.probers: dict[str, Prober] = {}
        self.listen_streams: dict[str, ListenStream] = {}
        self._uris: dict[str, tuple[str, ...]] = {}
        #: With a cluster: URIs other processes cached, by upstream (read by the holder's mirror loop).
        self._shared_uris: dict[str, list[str]] = {}
        self._uris_at: float | None = None
        self._versions_labelled: dict[str, set[str]] = {}
        self.invalidator = invalidator
        self.cluster = cluster
        self.leases: Leases | None = None
        self.mirror = (
            RegistryMirror(cluster.link, self.state, cluster.identities, cluster.keys) if cluster is not None else None
        )
        self._upstreams: Mapping[str, Upstream] = {}
        self._jobs: dict[str, list[asyncio.Task[None]]] = {}

    @property
    def ready(self) -> bool:
        """Probing is off, or every upstream has been probed once."""
        return self.settings is None or self.state.ready

    def observe(self, upstream: str, version: str) -> None:
        """The proxy's ``on_success`` hook: ``version`` worked for ``upstream`` in real traffic."""
        state = self.state.upstreams.get(upstream)
        if state is None or version in state.observed:
            return
        self.state.observe(upstream, version)
        mirror = self.mirror
        if mirror is not None and version in state.observed and self.leases and not self.leases.doing.get(upstream):
            self.tasks.spawn(self._post_observed(mirror, upstream, version), name=f"observed:{upstream}")

    async def _post_observed(self, mirror: RegistryMirror, upstream: str, version: str) -> None:
        try:
            await mirror.post_observed(upstream, version)
        except Unavailable:
            pass  # seen again in later traffic, or by the holder itself

    # -- lifecycle (called from the app's cleanup_ctx) --

    def start(self, upstreams: Mapping[str, Upstream]) -> None:
        """Start one probe loop and one listen stream per upstream (no-op without ``[registry]``);
        with a cluster, only for the upstreams whose lease this process holds."""
        settings = self.settings
        if settings is None:
            return
        self._upstreams = upstreams
        if self.cluster is None:
            for name in upstreams:
                self._start_jobs(name)
            return
        self.leases = Leases(
            self.cluster.link,
            upstreams,
            self._lease_changed,
            names={name: f"{name}:{self.cluster.identities[name]}" for name in upstreams},
            held_in_redis=lambda name, held: self.metrics.cluster_leases.labels(name).set(1 if held else 0),
        )
        self.tasks.spawn(self.leases.run(), name="registry:leases")
        self.tasks.spawn(self._mirror_loop(), name="registry:mirror")

    def reload(self, config: GatewayConfig, upstreams: Mapping[str, Upstream], *, fresh: Collection[str]) -> None:
        """Serve ``config``'s upstreams from now on (``upstreams``: their clients): those not in it
        stop being probed and listened to and leave the metrics; those in ``fresh`` (added, or
        whose answers may differ now) start over, probed at once; the others keep their state,
        probe schedule and listen stream, on their new client (another timeout, say). The state
        is a new :class:`RegistryState` (the requests begun before keep the old one), sharing
        the kept upstreams' states. With a cluster (its identities reloaded first:
        :meth:`Cluster.reload <gateway.cluster.Cluster.reload>`), the leases follow: an added or
        changed upstream's jobs start once this process takes its lease (tried at once), a gone
        one's lease is given up."""
        previous = self.state.upstreams
        state = RegistryState(())
        state.upstreams = {
            name: previous[name] if name in previous and name not in fresh else UpstreamState(name)
            for name in config.upstreams
        }
        for name in previous:
            if name not in config.upstreams or name in fresh:
                self._stop_jobs(name)
                self._forget(name)
        self.state = state
        if self.mirror is not None:
            self.mirror.state = state
        self.config = config
        self._upstreams = upstreams
        if self.settings is None:
            return
        if self.leases is not None and self.cluster is not None:
            self.leases.update({name: f"{name}:{self.cluster.identities[name]}" for name in upstreams})
        for name, upstream in upstreams.items():
            if name not in self._jobs:
                if self.leases is None:  # with leases: once this process holds the lease
                    self._start_jobs(name)
                continue
            self.probers[name].upstream = upstream
            if (stream := self.listen_streams.get(name)) is not None:
                stream.upstream = upstream  # from its next subscription on

    def _stop_jobs(self, name: str) -> None:
        for task in self._jobs.pop(name, []):
            task.cancel()
        self.listen_streams.pop(name, None)
        self.probers.pop(name, None)

    def _forget(self, name: str) -> None:
        """``name``'s series leave the metrics: an alert on a gone upstream must not fire."""
        with contextlib.suppress(KeyError):
            self.metrics.upstream_up.remove(name)
        if self.cluster is not None:
            with contextlib.suppress(KeyError):
                self.metrics.cluster_leases.remove(name)
        for version in self._versions_labelled.pop(name, set()):
            with contextlib.suppress(KeyError):
                self.metrics.upstream_supported_version.remove(name, version)

    def _lease_changed(self, name: str, held: bool) -> None:
        if held:
            self._start_jobs(name)
        else:
            for task in self._jobs.pop(name, []):
                task.cancel()
            self.listen_streams.pop(name, None)

    def _start_jobs(self, name: str) -> None:
        """Probe ``name`` and (if wanted) hold its listen stream, from now on."""
        settings = self.settings
        assert settings is not None
        upstream = self._upstreams[name]
        state = self.state.upstreams[name]
        self.probers[name] = Prober(upstream, timeout_s=settings.probe_timeout_s)
        jobs = [self.tasks.spawn(self._probe_loop(name), name=f"probe:{name}")]
        if settings.listen:
            stream = ListenStream(
                upstream,
                state,
                settings,
                purge=self.purge,
                cached_uris=self.cached_uris,
                sleep=self.sleep,
                rng=self.rng,
            )
            self.listen_streams[name] = stream
            jobs.append(self.tasks.spawn(stream.run(), name=f"listen:{name}"))
        self._jobs[name] = jobs

    async def _mirror_loop(self) -> None:
        """Every :data:`~.shared.MIRROR_S`: write the state of the upstreams this process holds,
        copy the others'."""
        assert self.mirror is not None and self.leases is not None
        while True:
            for name in list(self.state.upstreams):
                if name not in self.state.upstreams or name not in self.leases.doing:
                    continue  # gone in a reload meanwhile
                try:
                    if self.leases.doing[name]:
                        if self.cluster is not None and self.cluster.up:
                            await self.mirror.publish(name)
                            uris = await self.cluster.cached_uris(name, MAX_RESOURCE_SUBSCRIPTIONS)
                            self._shared_uris[name] = uris
                    elif await self.mirror.load(name):
                        self._export(name, self.state.upstreams[name])
                except Unavailable:
                    pass  # Redis is away: the leases make every process probe for itself
            await asyncio.sleep(MIRROR_S)

    async def stop(self) -> None:
        """Cancel every probe and listen stream and wait for them; give up the leases held."""
        await self.tasks.close()
        if self.leases is not None:
            await self.leases.release_all()

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
        stream = self.listen_streams.get(name)
        if stream is not None and result.reachable and before != (state.probe_health, state.era, state.capabilities):
            # Back, or changed: reconsider the stream now rather than after the listen backoff.
            stream.wake.set()
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

    def purge(self, invalidation: Invalidation, reason: str) -> int:
        """Remove matching cache entries (counted under ``cache_evictions{reason}``) here and, through
        the invalidator, from every other worker and replica; returns how many went here."""
        return self.invalidator.invalidate_soon(invalidation, reason)

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
            for name, uris in self._shared_uris.items():
                found.setdefault(name, set()).update(uris)
            self._uris = {name: tuple(sorted(uris)[:MAX_RESOURCE_SUBSCRIPTIONS]) for name, uris in found.items()}
        return self._uris.get(upstream, ())
