"""This process's part in the cluster: the shared tier of the cache, single flight across
processes, and invalidation that reaches every process.

Everything that names one upstream names it with its *identity* too, the keyed digest of how
this process reaches it (:meth:`~gateway.cluster.mac.Keys.identity`: url, headers, the settings
that change its answers): two processes share an entry, a lock, a generation, the URI index, a
lease or the registry's state of an upstream only when they would send it the same request with
the same credentials. ``<digest>`` below is :func:`~gateway.cluster.entries.key_digest` of the
cache key and that identity. Entries, events and the registry's state carry an HMAC-SHA256
(:mod:`.mac`), checked before use; the rest is checked for plausibility.

Redis keys (all under ``key_prefix``), each with its bound:

* ``entry:<generation>:<digest>``: a shared entry (:mod:`gateway.cluster.entries`), at most
  ``max_entry_bytes``, with Redis expiry at the entry's own, or, for an upstream with
  ``stale_if_error_ms``, that much later: an expired entry read in that window is never a hit,
  only what answers stale when fetching it again fails (a replica that never held it answers
  stale too).
* ``lock:<generation>:<digest>``: the cold key's leader (a redis-py ``Lock``: a token and an
  expiry of the upstream's ``timeout_s`` plus :data:`LOCK_MARGIN_S`).
* ``generations:<upstream>:<identity>``: a hash ``<method>`` → generation, six fields, expiring
  a day after its last use (:mod:`gateway.cluster.generations`).
* ``events``: the feed, a stream trimmed to about 100,000 events (:mod:`gateway.cluster.feed`).
* ``uris:<upstream>:<identity>``: the URIs of shared ``resources/read`` entries, for the listen
  stream's ``resourceSubscriptions`` (held by one process for all): a sorted set of at most
  1,024 URIs of at most 2,048 characters, expiring with its longest-lived member
  (:mod:`gateway.cluster.uris`).
* ``lease:``, ``registry:`` and ``observed:<upstream>:<identity>``: the registry's
  (:mod:`gateway.cluster.lease`, :mod:`gateway.registry.shared`), each expiring within 60 s.

Single flight, per cold key: look in the shared tier; register to hear the key's ``done`` event;
take the lock. The holder looks once more (a leader may have just finished), then goes upstream,
and when the answer is in, writes the entry, frees the lock and says ``done``, in that order.
Everyone else waits for ``done`` (pushed by the feed: no polling) at most the upstream's
``timeout_s``, then reads the entry, or goes upstream alone if there is none (the answer was
private, an error, or the leader died). An entry read while an invalidation raised its
generation is not used (it may be the one invalidated): the caller goes upstream alone. A
lock without expiry is not a lock this gateway took (written over): it is removed.

Refresh-ahead takes the same lock (:meth:`Cluster.lookup` with ``refresh=True``): one refresh per
key per cluster. A process whose entry is due looks in the shared tier first (an entry not due
yet is another process's refresh: adopted), then takes the lock; one that does not get it waits
for the holder's ``done`` and adopts what it stored, or skips the refresh (its entry stays as it
was). The refresh ends like a cold key's flight (:meth:`Cluster.finish`).

Invalidation: the local entries go at once; then the generations are raised and the event
published (:mod:`gateway.cluster.outbox`; what Redis does not take waits there). Whether the
shared tier is up, down or read-only is :mod:`gateway.cluster.link`'s state machine; this
process follows it (:meth:`Cluster._state_changed`): leaving ``up`` empties the local tier, and
``read_only`` holds it (nothing stored) until Redis takes writes again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio.lock import Lock
from redis.exceptions import LockError, RedisError

from ..cache import CacheEntry, CacheKey, CacheStore, Clock, Invalidation, uri_of
from ..config import GatewayConfig
from ..protocol import CACHEABLE_METHODS
from ..tasks import CLOSE_TIMEOUT_S, BackgroundTasks
from ..telemetry import GatewayMetrics
from .entries import decode, encode, key_digest, name_digest
from .feed import Feed
from .flight import Flight, Lookup, lock_is_live, release_quietly
from .generations import TOUCH_S, Generations
from .link import RedisLink, State, Unavailable
from .mac import Keys
from .outbox import Outbox, Pending
from .uris import MAX_URI_CHARS, UriIndex
from .waiters import Waiters

__all__ = ["LOCK_MARGIN_S", "Cluster", "Flight", "Lookup", "Spread"]

log = logging.getLogger("mcp_gateway.cluster")

#: How long a starting process waits for Redis before it serves without, in seconds.
STARTUP_WAIT_S: Final = 2.0
#: A leader's lock outlives its upstream request's bound by this much, in seconds.
LOCK_MARGIN_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class Spread:
    """What :meth:`Cluster.invalidate` did: ``count`` local entries removed; ``delivered``:
    every other process and the shared tier have it (else it waits in the outbox)."""

    count: int
    delivered: bool


class Cluster:
    """The shared tier for one process (see the module). ``store`` is the local tier, in front
    of it; ``clock`` the cache's monotonic seconds, ``wall_clock`` epoch seconds (shared entries
    expire on wall-clock time, the same in every process)."""

    def __init__(
        self,
        config: GatewayConfig,
        store: CacheStore,
        metrics: GatewayMetrics,
        *,
        clock: Clock,
        wall_clock: Clock = time.time,
    ) -> None:
        assert config.cluster is not None
        self.config = config
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.link = RedisLink(config.cluster, metrics)
        self.keys = Keys(config.cluster.secret)
        #: Each upstream's identity (:meth:`~gateway.cluster.mac.Keys.identity`), by name.
        self.identities = self.keys.identities(config)
        self.node_id = secrets.token_hex(8)
        self.feed = Feed(
            config.cluster, self.link, keys=self.keys, on_event=self._event, on_up=self._reload, on_lost=self._lost
        )
        self.tasks = BackgroundTasks(log)
        self.max_ttl_ms = config.cache.max_ttl_ms
        self.max_entry_bytes = config.cache.max_entry_bytes
        self.generations = Generations(self.link, self.identities, sorted(CACHEABLE_METHODS))
        self.uris = UriIndex(self.link, self.identities)
        self.waiters = Waiters()
        self.outbox = Outbox(
            self.link,
            self.generations,
            self.feed,
            metrics,
            origin=self.node_id,
            scope=self._scope,
            delivered=self._delivered,
        )
        self.link.on_change = self._state_changed
        self.link.before_writable = self.outbox.flush

    @property
    def up(self) -> bool:
        return self.link.up

    # -- lifecycle --

    async def start(self) -> None:
        """Start reading the feed, and wait until Redis answers, at most :data:`STARTUP_WAIT_S`
        (the gateway starts serving after this: its first answers are then shared; with Redis
        down it serves without it, and joins when Redis answers)."""
        self.tasks.spawn(self.feed.run(), name="cluster:feed")
        self.tasks.spawn(self.link.heartbeat(), name="cluster:heartbeat")
        self.tasks.spawn(self._touch_loop(), name="cluster:touch")
        try:
            async with asyncio.timeout(STARTUP_WAIT_S):
                await self.link.answering.wait()
        except TimeoutError:
            log.warning("shared tier: Redis did not answer within %g s; serving without it for now", STARTUP_WAIT_S)

    async def stop(self) -> None:
        """End the background work, then the connections, each bounded (a mute Redis never holds the shutdown)."""
        await self.tasks.close()
        self.waiters.release_all()
        for what, close in (("event feed", self.feed.close), ("client", self.link.close)):
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await close()
            except (TimeoutError, OSError, RedisError) as exc:
                log.warning("shared tier: closing its %s at shutdown: %s", what, type(exc).__name__)

    def reload(self, config: GatewayConfig) -> None:
        """Serve ``config``'s upstreams (:mod:`gateway.reload`; its ``[cluster]`` is the running
        one): each keeps its identity, or gets a new one (added, or an answer-changing setting
        changed), shared once its generations are read from Redis (in the background, or on
        reconnecting); a removed one is shared no more."""
        identities = self.keys.identities(config)
        self.identities.clear()  # in place: the registry's mirror and the URI index read this dict
        self.identities.update(identities)
        self.config = config
        self.max_ttl_ms, self.max_entry_bytes = config.cache.max_ttl_ms, config.cache.max_entry_bytes
        if fresh := self.generations.reidentify(identities):
            self.tasks.spawn(self.generations.sync_soon(fresh), name="cluster:sync")

    async def _touch_loop(self) -> None:
        """Keep this process's generations hashes from expiring while it uses them."""
        while True:
            await asyncio.sleep(TOUCH_S)
            try:
                await self.generations.touch()
            except Unavailable:
                pass  # the next sync (on reconnecting) sets the expiry again

    # -- names --

    def _field(self, upstream: str, method: str) -> str:
        return self.generations.field(upstream, method)

    def digest(self, key: CacheKey) -> bytes:
        """:func:`key_digest` of ``key`` for its upstream as this process reaches it."""
        return key_digest(key, self.identities[key.upstream])

    def ident(self, key: CacheKey) -> str:
        """``<generation>:<digest>``: the key's name in Redis right now."""
        return f"{self.generations.of(self._field(key.upstream, key.method))}:{self.digest(key).hex()}"

    def shares(self, key: CacheKey) -> bool:
        """Whether ``key``'s entries may live in Redis: not for an upstream that receives the
        caller's ``Authorization`` (its entries belong to one authorization context), nor while
        an invalidation of them has not got through (:mod:`gateway.cluster.outbox`)."""
        if key.authorization is not None or key.upstream not in self.identities:
            return False
        if (unsynced := self.generations.unsynced) and key.upstream in unsynced:
            return False  # a reload gave it a new identity whose generations are not read yet
        fenced = self.outbox.fenced
        return not fenced or self._field(key.upstream, key.method) not in fenced

    # -- the shared tier --

    async def lookup(self, key: CacheKey, timeout_s: float, *, refresh: bool = False) -> Lookup:
        """After a local miss: the shared entry, or the cluster's single flight for ``key``
        (``timeout_s``: the upstream's, how long a follower waits for the leader). With
        ``refresh`` (refresh-ahead of a local entry that is due): an entry counts only if it is
        not due itself (another process refreshed it), and a process that does not get the lock
        skips the refresh unless the holder's answer arrives (see the module). Never raises for
        Redis: with Redis down or failing, the answer is "go alone"."""
        if not self.link.up or not self.shares(key):
            return Lookup()
        ident = self.ident(key)
        entry = await self._read(key, ident)
        if self._usable(entry, refresh):
            return Lookup(entry) if self.ident(key) == ident else Lookup()
        stale = self._stale(entry)
        done = self.waiters.expect(ident)
        try:
            lock = Lock(
                self.link.client,
                self.link.key("lock", ident),
                timeout=timeout_s + LOCK_MARGIN_S,
                blocking=False,
                thread_local=False,
            )
            try:
                leading = await self.link.run("lock", lock.acquire)
            except Unavailable:
                return Lookup(stale=stale) if self.ident(key) == ident else Lookup()
            if leading:
                entry = await self._read(key, ident)  # a leader may have finished just now
                if self._usable(entry, refresh):
                    self.tasks.spawn(release_quietly(self.link, lock), name="cluster:unlock")
                    return Lookup(entry) if self.ident(key) == ident else Lookup()
                stale = self._stale(entry)  # read again: an answer since may have ended its window
                return Lookup(flight=Flight(ident, lock), stale=stale if self.ident(key) == ident else None)
            if not await lock_is_live(self.link, ident):
                return Lookup(stale=stale) if self.ident(key) == ident else Lookup()
            try:
                async with asyncio.timeout(timeout_s):
                    stored = await done
            except TimeoutError:
                stored = False
            # Read again after the leader: what it stored, or whether its answer ended the window.
            entry = await self._read(key, ident) if stored or stale is not None else None
            if self.ident(key) != ident:
                return Lookup()
            if stored and self._usable(entry, False):
                return Lookup(entry, collapsed=True)
            return Lookup(stale=self._stale(entry), skipped=refresh)
        finally:
            self.waiters.forget(ident, done)

    def _usable(self, entry: CacheEntry | None, refresh: bool) -> bool:
        """Whether a shared ``entry`` answers as a hit (fresh), or for a refresh, is not due."""
        if entry is None:
            return False
        return self.clock() < (entry.refresh_at if refresh else entry.expires_at)

    def _stale(self, entry: CacheEntry | None) -> CacheEntry | None:
        """``entry`` if it expired (it is in its stale window: :func:`decode` saw to that)."""
        return entry if entry is not None and entry.expires_at <= self.clock() else None

    def finish(self, flight: Flight, key: CacheKey, entry: CacheEntry | None, *, supersede: bool = False) -> None:
        """The leader's outcome: write ``entry`` (``None``: nothing storable; ``supersede``: the
        stale window ends, :meth:`supersede`), free the lock, say ``done``; in the background, in that order."""
        if flight.finished:
            return
        flight.finished = True
        self.tasks.spawn(self._finish(flight, key, entry, supersede), name="cluster:finish")

    async def _finish(self, flight: Flight, key: CacheKey, entry: CacheEntry | None, supersede: bool) -> None:
        stored = False
        if entry is not None:
            stored = await self._write(key, flight.ident, entry)
        elif supersede and (window_ms := self.config.stale_if_error_ms(key.upstream)) and self.shares(key):
            await self._shorten(self.link.key("entry", flight.ident), window_ms)
        try:
            await self.link.run("unlock", flight.lock.release)
        except (Unavailable, LockError):
            pass  # expired already (LockError: not ours any more), or Redis is away: it expires by itself
        try:
            await self.feed.publish({"type": "done", "id": flight.ident, "stored": stored})
        except Unavailable:
            pass  # the followers stop waiting at their bound

    def share(self, key: CacheKey, entry: CacheEntry) -> None:
        """Write an entry this process stored without leading a flight for it (the cluster was
        down when it went upstream), in the background."""
        if self.link.up and self.shares(key):
            ident = self.ident(key)

            async def write() -> None:
                await self._write(key, ident, entry)

            self.tasks.spawn(write(), name="cluster:share")

    async def _read(self, key: CacheKey, ident: str) -> CacheEntry | None:
        """The shared entry of ``key``, fresh or (for an upstream with ``stale_if_error_ms``)
        expired within its stale window; ``None`` if there is none or it is not valid."""
        try:
            value = await self.link.run("get", lambda: self.link.client.get(self.link.key("entry", ident)))
        except Unavailable:
            self.metrics.cluster_reads.labels("error").inc()
            return None
        if value is None:
            self.metrics.cluster_reads.labels("miss").inc()
            return None
        entry = decode(
            self.keys,
            value,
            name_digest(ident),
            clock_now=self.clock(),
            wall_now=self.wall_clock(),
            max_ttl_ms=self.max_ttl_ms,
            max_entry_bytes=self.max_entry_bytes,
            stale_if_error_ms=self.config.stale_if_error_ms(key.upstream),
            refresh_ahead=self.config.refresh_ahead(key.upstream),
        )
        if isinstance(entry, str):
            self.metrics.cluster_reads.labels(entry).inc()
            log.warning("shared tier: the value of %s is %s; treated as a miss", ident, _WHY[entry])
            return None
        self.metrics.cluster_reads.labels("hit").inc()
        return entry

    async def _write(self, key: CacheKey, ident: str, entry: CacheEntry) -> bool:
        if not self.shares(key):
            return False  # an invalidation of it is waiting to get through
        value, left_ms = encode(
            self.keys, name_digest(ident), entry, clock_now=self.clock(), wall_now=self.wall_clock()
        )
        if left_ms <= 0:
            return False
        # Redis keeps it for as long as an entry may answer: its stale window too, if any.
        px = left_ms + self.config.stale_if_error_ms(key.upstream)
        try:
            await self.link.run("set", lambda: self.link.client.set(self.link.key("entry", ident), value, px=px))
            if key.method == "resources/read" and isinstance(uri := uri_of(key), str) and len(uri) <= MAX_URI_CHARS:
                gone_at_ms = int(self.wall_clock() * 1000) + px
                now_ms = int(self.wall_clock() * 1000)
                await self.link.run("uris", lambda: self.uris.note(key.upstream, uri, gone_at_ms, now_ms=now_ms))
        except Unavailable:
            return False
        return True

    def supersede(self, key: CacheKey) -> None:
        """The upstream answered ``key`` and its answer was not stored (an error, private, ...):
        the shared entry loses its stale window (Redis expiry back to its freshness; an expired one
        goes), in the background. A no-op without ``stale_if_error_ms`` or with Redis down."""
        if (window_ms := self.config.stale_if_error_ms(key.upstream)) and self.link.up and self.shares(key):
            name = self.link.key("entry", self.ident(key))
            self.tasks.spawn(self._shorten(name, window_ms), name="cluster:supersede")

    async def _shorten(self, name: str, window_ms: int) -> None:
        """Take ``window_ms`` off the Redis expiry of the entry ``name``; remove it if that is all it has left."""
        try:
            left = await self.link.run("pttl", lambda: self.link.client.pttl(name))
            if isinstance(left, int) and left > 0:
                if left > window_ms:
                    await self.link.run("pexpire", lambda: self.link.client.pexpire(name, left - window_ms))
                else:
                    await self.link.run("del", lambda: self.link.client.delete(name))
        except Unavailable:
            pass  # Redis is away: it expires by itself at the end of the window

    async def cached_uris(self, upstream: str, limit: int) -> list[str]:
        """Up to ``limit`` resource URIs some process cached for ``upstream`` whose entries are
        still in Redis (:meth:`UriIndex.read <gateway.cluster.uris.UriIndex.read>`).

        Raises:
            Unavailable: Redis is down or failed.
        """
        return await self.uris.read(upstream, limit, now_ms=int(self.wall_clock() * 1000))

    # -- invalidation --

    async def invalidate(self, invalidation: Invalidation, reason: str) -> Spread:
        """Remove what ``invalidation`` matches from this process and, through Redis, from every
        other one and from the shared tier. ``delivered`` when this returns with the others
        told; else (Redis down, refusing writes, too slow) it waits in the outbox, and is sent
        again before the shared tier is up again (:mod:`gateway.cluster.outbox`)."""
        count = self.store.purge(invalidation, reason)
        later, delivered = await self._spread(invalidation, reason)
        return Spread(count + later, delivered)

    def invalidate_soon(self, invalidation: Invalidation, reason: str) -> int:
        """:meth:`invalidate` for callers that cannot wait: the local entries go now (their
        count is returned), the others in the background."""
        count = self.store.purge(invalidation, reason)
        self.tasks.spawn(self._spread_quietly(invalidation, reason), name="cluster:invalidate")
        return count

    async def _spread_quietly(self, invalidation: Invalidation, reason: str, *, echo: bool = False) -> None:
        await self._spread(invalidation, reason, echo=echo)

    def _scope(self, invalidation: Invalidation) -> tuple[list[str], list[str]]:
        """The (upstreams, methods) of this process's generations that ``invalidation`` touches."""
        if invalidation.upstream is None:
            upstreams = list(self.identities)
        else:
            upstreams = [invalidation.upstream] if invalidation.upstream in self.identities else []
        methods = sorted(CACHEABLE_METHODS) if invalidation.methods is None else list(invalidation.methods)
        return upstreams, [m for m in methods if m in CACHEABLE_METHODS]

    def _covers(self, generations: object, invalidation: Invalidation) -> bool:
        """Whether an event's ``generations`` raised every generation of this process's
        configuration that ``invalidation`` touches (else it came from a process configured
        otherwise for that upstream, and this one raises its own: see :meth:`_event`)."""
        upstreams, methods = self._scope(invalidation)
        raised = generations if isinstance(generations, dict) else {}
        return all(self._field(u, m) in raised for u in upstreams for m in methods)

    async def _spread(self, invalidation: Invalidation, reason: str, *, echo: bool = False) -> tuple[int, bool]:
        """Raise the generations ``invalidation`` touches and tell every process; returns how
        many local entries went meanwhile (read back from Redis while the bump was on its way)
        and whether it got through (else it waits in the outbox, fenced)."""
        upstreams, methods = self._scope(invalidation)
        delivered = await self.outbox.send(invalidation, reason, upstreams, methods, echo=echo)
        return self.store.purge(invalidation, reason), delivered

    def _delivered(self, pending: Pending) -> None:
        """A pending invalidation got through late: what was stored meanwhile goes too."""
        self.store.purge(pending.invalidation, pending.reason)

    async def _reload(self) -> None:
        """On (re)connecting: the generations as Redis has them, and a first heartbeat (whether
        writes go through). With invalidations waiting, the shared tier stays read-only until
        the heartbeat has sent them (:meth:`RedisLink.beat`), rather than within the feed's bound."""
        await self.generations.sync()
        if self.outbox.pending:
            self.link.refused("invalidations of this process are waiting to get through")
        else:
            await self.link.beat(settle=False)

    def _state_changed(self, old: State, new: State, reason: str) -> None:
        """Follow the link's state (:mod:`gateway.cluster.link`): the local tier is held while
        read-only, and emptied on leaving ``up`` (and on entering read-only from ``down``: what
        was stored while down cannot be vouched for either)."""
        self.store.hold(new == "read_only")
        if new == "read_only" or old == "up":
            self._lost(reason, quiet=True)  # the link logged the change

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "done":
            self.waiters.done(event.get("id"), event.get("stored") is True)
        elif kind == "invalidate":
            self.generations.adopt(event.get("generations"))
            invalidation = Invalidation.from_json(event.get("invalidation"))
            reason = event.get("reason")
            if invalidation is None or event.get("origin") == self.node_id:
                return
            reason = reason if reason in _REASONS else "notification"
            self.store.purge(invalidation, reason)
            if event.get("echo") is not True and not self._covers(event.get("generations"), invalidation):
                # A process configured otherwise for the upstream raised its own generations, not
                # this configuration's: raise ours too, or our shared entries would outlive the purge.
                self.tasks.spawn(self._spread_quietly(invalidation, reason, echo=True), name="cluster:echo")

    def _lost(self, reason: str, *, quiet: bool = False) -> None:
        """The feed cannot vouch for the local tier any more: empty it, stop every wait."""
        count = self.store.purge(lambda _k: True, "cluster")
        self.waiters.release_all()
        if not quiet:
            log.info("shared tier: %s; local entries dropped: %d", reason, count)


#: ``cluster_reads{result}`` outcome → what the log says of such a value.
_WHY: Final = {"forged": "not MAC'd with this cluster's secret (forged, altered, another secret)", "corrupt": "invalid"}

_REASONS: Final = frozenset({"purge", "notification", "stream_lost"})
