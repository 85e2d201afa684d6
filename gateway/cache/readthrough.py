"""The read-through: how a cacheable request that missed the local tier gets its answer, for every
route (``/servers/{name}/mcp``, refresh-ahead, the parts of ``POST /mcp``).

In order: the first request on a cold key leads it and the others wait for its outcome
(coalescing, :class:`~.coalesce.Coalescer`); the leader asks the shared tier, if there is one (an
entry there answers; else this process leads the key for the cluster: a ``flight``); a key backing
off after failures answers from its stale entry, if one is kept; else the route's ``fetch`` goes
upstream, and what it answers is kept (:meth:`Lead.keep`: stored where the policy allows, the
stale window ended where not) and handed to the followers. A fetch that fails answers from the
stale entry if one is kept (stale-if-error, :mod:`.stale`), else its failure is every follower's
too. A busy upstream (the gateway's own ``max_inflight``) is no failure: no backoff, but a kept
stale entry answers all the same.

No I/O of its own: the route's ``fetch`` callback does it, and the shared tier is anything with
:class:`SharedTier`'s methods (``gateway.cluster.Cluster``). MCP 2026-07-28,
server/utilities/caching: 'Freshness Calculation' (an answer is kept for no longer than ``ttlMs``;
a stale one may answer when fetching again fails) and 'Cache Scope Field' (only ``public``).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from ..tasks import BackgroundTasks
from .coalesce import Coalescer
from .keys import CacheKey
from .policy import CacheEntry, StoreOutcome, build_entry, store_outcome
from .stale import ABANDONED, Abandoned, Backoff, Failed, Stale
from .store import CacheStore, Clock

if TYPE_CHECKING:
    from ..config import GatewayConfig
    from ..telemetry import GatewayMetrics

__all__ = ["COALESCED", "HIT", "SHARED", "Answer", "CacheLookup", "Cached", "Lead", "ReadThrough", "SharedTier"]

log = logging.getLogger("mcp_gateway.cache")

T = TypeVar("T")


class CacheLookup(StrEnum):
    """How the cache answered a request: the ``lookup`` label of the request record (its value),
    and its ``cache`` label (:attr:`cache`: ``hit``, ``stale``, ``miss`` or ``bypass``)."""

    cache: str

    def __new__(cls, value: str, cache: str) -> CacheLookup:
        member = str.__new__(cls, value)
        member._value_ = value
        member.cache = cache  # an attribute, not a property: every request reads it
        return member

    #: A fresh entry of this process.
    HIT = "hit", "hit"
    #: An entry from the shared tier.
    SHARED = "shared", "hit"
    #: The entry another request's fetch just brought (it waited for it).
    COALESCED = "coalesced", "hit"
    #: An expired entry, in place of a failing or busy upstream (stale-if-error).
    STALE = "stale", "stale"
    #: Not in the cache: the upstream was asked.
    MISS = "miss", "miss"
    #: Not cacheable, or the cache is off: not looked up.
    BYPASS = "bypass", "bypass"


#: The members, as module names: reading an enum's member off its class costs about 0.2 us on
#: Python 3.11 (``EnumType.__getattr__``), ten times a global, and a cache hit reads one.
HIT: Final = CacheLookup.HIT
SHARED: Final = CacheLookup.SHARED
COALESCED: Final = CacheLookup.COALESCED


@dataclass(frozen=True, slots=True)
class Cached:
    """An answer from a cache entry: ``stale`` (expired, answering for a failing upstream),
    ``collapsed`` (what another request's fetch just brought: RFC 9211 ``collapsed``), ``shared``
    (from the shared tier); ``waited_s``: seconds the shared tier's lookup took."""

    entry: CacheEntry
    stale: bool = False
    collapsed: bool = False
    shared: bool = False
    waited_s: float = 0.0

    @property
    def lookup(self) -> CacheLookup:
        if self.stale:
            return CacheLookup.STALE
        return COALESCED if self.collapsed else SHARED if self.shared else HIT


class Flight(Protocol):
    """The shared tier's lead of a cold key, finished with :meth:`SharedTier.finish`."""

    finished: bool


class Found(Protocol):
    """What the shared tier gave for a local miss (``gateway.cluster.Lookup``)."""

    entry: CacheEntry | None
    collapsed: bool
    flight: Any
    stale: CacheEntry | None
    skipped: bool


class SharedTier(Protocol):
    """What the read-through needs of a shared tier (``gateway.cluster.Cluster``)."""

    async def lookup(self, key: CacheKey, timeout_s: float, *, refresh: bool = False) -> Found: ...

    def finish(self, flight: Any, key: CacheKey, entry: CacheEntry | None, *, supersede: bool = False) -> None: ...

    def share(self, key: CacheKey, entry: CacheEntry) -> None: ...

    def supersede(self, key: CacheKey) -> None: ...


#: An upstream's whole answer: (HTTP status, the JSON-RPC response, its size in bytes).
Answer = tuple[int, Any, int]


class Lead:
    """One fetch of ``key`` under way, and what keeping its answer needs. ``leading``: the
    requests coalesced on the key wait for it (they get the outcome from :meth:`keep`, or when the
    read ends); ``flight``: this process leads the key for the whole cluster too; ``purges``: the
    store's purge count for the upstream when the read began (an answer that crosses a purge may
    be what the purge was for, and is not stored); ``waited_s``: seconds the shared tier took."""

    __slots__ = ("_future", "_through", "answered", "flight", "key", "leading", "purges", "waited_s")

    def __init__(self, through: ReadThrough, key: CacheKey, *, leading: bool) -> None:
        self._through = through
        self.key = key
        self.leading = leading
        #: What this lead's followers wait on (the key's slot may be a newer leader's after a reload).
        self._future = through.coalescer.future_of(key) if leading else None
        self.flight: Any = None
        self.purges = through.store.purges_of(key.upstream)
        self.waited_s = 0.0
        #: The upstream answered (:meth:`keep` ran): what follows is no failure to fetch.
        self.answered = False

    def keep(self, status: int, message: object, size: int, method: str) -> tuple[StoreOutcome, CacheEntry | None]:
        """Keep the upstream's answer (``message``, ``size`` bytes, HTTP ``status``) to a ``method``
        request: see :meth:`ReadThrough.keep`. The followers get the entry (or go alone) now, not
        when this caller has read the whole answer: a caller that stops reading holds back no one."""
        self.answered = True
        outcome, entry = self._through.keep(self.key, method, status, message, size, self.purges, self.flight)
        self.release(entry)
        return outcome, entry

    def release(self, outcome: CacheEntry | Stale | Failed | Abandoned | None) -> None:
        """Hand ``outcome`` to the followers, once."""
        if self.leading:
            self.leading = False
            self._through.coalescer.release(self.key, outcome, self._future)

    def close(self) -> None:
        """The read ended: followers not answered yet read the key again (the leader stopped
        before the upstream answered); the cluster's lead ends."""
        self.release(ABANDONED)
        if self.flight is not None and (shared := self._through.shared) is not None:
            shared.finish(self.flight, self.key, None)  # a no-op once keep finished it


class ReadThrough:
    """The read-through of one process (see the module): ``store`` is the local tier,
    ``shared`` the shared tier behind it (``None`` without ``[cluster]``). ``failures`` are the
    exceptions of a fetch that failed (the upstream refused, reset, timed out, or gave no JSON-RPC
    answer): the key backs off and a stale entry may answer; ``busy`` those of an upstream at its
    in-flight bound. ``clock`` gives the store's monotonic seconds."""

    def __init__(
        self,
        config: GatewayConfig,
        store: CacheStore,
        metrics: GatewayMetrics,
        clock: Clock,
        *,
        failures: tuple[type[Exception], ...],
        busy: tuple[type[Exception], ...],
        shared: SharedTier | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.shared = shared
        self.metrics = metrics
        self.failures = failures
        self.busy = busy
        self.coalescer = Coalescer()
        self.max_entry_bytes = config.cache.max_entry_bytes
        self.max_ttl_ms = config.cache.max_ttl_ms
        #: Per upstream: (stale_if_error_ms, refresh_ahead), what its entries are built with.
        self.entry_options = {
            name: (config.stale_if_error_ms(name), config.refresh_ahead(name)) for name in config.upstreams
        }
        #: When each failing key may be fetched again: only after failures to fetch; an upstream
        #: that answers clears it.
        self.backoff = Backoff()
        #: When a key whose last refresh was answered but not storable (an error, too large...)
        #: may be refreshed again: apart from ``backoff``, so that such an answer never makes a
        #: miss serve the stale entry in place of asking the upstream.
        self.refresh_backoff = Backoff()
        #: The refresh-ahead fetches under way (each leads its key).
        self.refreshes = BackgroundTasks(log)
        #: Per upstream, how many reloads dropped its entries (every generation's read-through
        #: shares this dict: :meth:`drop`), and the counts when this one's generation was built.
        self.drops: dict[str, int] = {}
        self.built_at: dict[str, int] = {}

    def retuned(self, config: GatewayConfig) -> ReadThrough:
        """The read-through of a reloaded ``config``: its entry bounds and per-upstream entry
        options, over the same store, shared tier, coalescing, backoffs and refreshes (a key
        under way before the reload is still led by its request, which keeps its own options)."""
        twin = copy.copy(self)
        twin.max_entry_bytes = config.cache.max_entry_bytes
        twin.max_ttl_ms = config.cache.max_ttl_ms
        twin.entry_options = {
            name: (config.stale_if_error_ms(name), config.refresh_ahead(name)) for name in config.upstreams
        }
        twin.built_at = dict(self.drops)
        return twin

    def drop(self, upstreams: Iterable[str]) -> None:
        """A reload drops ``upstreams``' entries (call it before building the next generation):
        the requests of every generation before stores none of their answers, nor reads theirs
        from the shared tier (they reach the upstream as the old config did: another ``url``,
        other ``headers``)."""
        for name in upstreams:
            self.drops[name] = self.drops.get(name, 0) + 1

    def current(self, upstream: str) -> bool:
        """Whether this generation reaches ``upstream`` as the config served now does (:meth:`drop`)."""
        return self.drops.get(upstream, 0) == self.built_at.get(upstream, 0)

    # -- a miss -------------------------------------------------------------------------------

    async def read(
        self, key: CacheKey, fetch: Callable[[Lead], Awaitable[T]], *, timeout_s: float, request_id: object
    ) -> Cached | T:
        """The answer to a request for ``key`` that missed the local tier: an entry
        (:class:`Cached`), or what ``fetch(lead)`` returned (it went upstream and called
        :meth:`Lead.keep` with the answer, if there was one). ``timeout_s``: how long to wait on
        another process's leader; ``request_id``: the caller's, on a failure it shares.

        Raises:
            whatever ``fetch`` raises when no stale entry may answer for it; a follower, the
            leader's failure (one of ``failures``) with its own ``request_id``.
        """
        waiter = self.coalescer.claim(key)
        while waiter is not None:
            got = await asyncio.shield(waiter)
            if got is ABANDONED:  # the leader stopped first: lead now, or follow whoever does
                if (entry := self.store.get(key)) is not None:
                    return Cached(entry)
                waiter = self.coalescer.claim(key)
                continue
            if isinstance(got, CacheEntry):
                return Cached(got, collapsed=True)
            if isinstance(got, Stale):
                return Cached(got.entry, stale=True, collapsed=True)
            if isinstance(got, Failed):
                # The leader could not fetch it just now: neither would this caller.
                error = copy.copy(got.error)
                error.request_id = request_id
                raise error
            return await fetch(Lead(self, key, leading=False))  # not storable: this caller's own
        lead = Lead(self, key, leading=True)
        try:
            if self.shared is not None and (not self.drops or self.current(key.upstream)):
                started = time.perf_counter()
                found = await self.shared.lookup(key, timeout_s)
                lead.waited_s = time.perf_counter() - started
                if found.entry is not None:
                    self.store.put(key, found.entry)
                    lead.release(found.entry)
                    return Cached(found.entry, collapsed=found.collapsed, shared=True, waited_s=lead.waited_s)
                lead.flight = found.flight
                if found.stale is not None:
                    self.store.put_stale(key, found.stale)  # to answer from if fetching fails
            if self.backoff.waiting(key, self.clock()) and (stale := self.store.stale(key)) is not None:
                return self._stale(lead, stale)
            try:
                return await fetch(lead)
            except self.busy:
                if lead.answered or (stale := self.store.stale(key)) is None:
                    raise
                return self._stale(lead, stale)  # busy, not failing: no backoff
            except self.failures as err:
                if lead.answered:
                    raise
                self.backoff.failed(key, self.clock())
                if (stale := self.store.stale(key)) is None:  # looked up now: a purge removed it?
                    lead.release(Failed(err))  # type: ignore[arg-type]  # failures are GatewayErrors
                    raise
                return self._stale(lead, stale)
        finally:
            lead.close()

    def _stale(self, lead: Lead, entry: CacheEntry) -> Cached:
        lead.release(Stale(entry))
        return Cached(entry, stale=True, waited_s=lead.waited_s)

    # -- keeping an answer --------------------------------------------------------------------

    def keep(
        self,
        key: CacheKey,
        method: str,
        status: int,
        message: object,
        size: int,
        purges: int,
        flight: Any = None,
    ) -> tuple[StoreOutcome, CacheEntry | None]:
        """Store the upstream's answer (``message``, ``size`` bytes, HTTP ``status``) to the
        cacheable ``method`` request ``key`` if the cache policy allows
        (:func:`~.policy.store_outcome`) and no purge that could be about it came since the read
        began (``purges``: the store's ``purges_of(upstream)`` then); in the shared tier too
        (``flight``: this process leads the key for the cluster, whose followers learn the outcome).

        ``message`` is the JSON-RPC response (``None``: a 4xx without one). Any response that is
        not stored, whatever its HTTP status (an error, private, no ``ttlMs``, too large,
        refused...), ends the key's stale window here and in the shared tier: it is the upstream's
        newest word on the key, and an older entry must not answer in its place once the upstream
        fails (an answer is no failure). Returns the outcome (the ``cache_stores`` label) and the
        entry stored, if any.
        """
        upstream = key.upstream
        outcome = store_outcome(status, message, size, self.max_entry_bytes)
        entry: CacheEntry | None = None
        current = not self.drops or self.current(upstream)
        if outcome is StoreOutcome.STORED and (self.store.purges_of(upstream) != purges or not current):
            outcome = StoreOutcome.REFUSED
        elif outcome is StoreOutcome.STORED and self.store.held:
            outcome = StoreOutcome.CLUSTER_READ_ONLY
        elif outcome is StoreOutcome.STORED:
            assert isinstance(message, dict)
            entry = self.build(upstream, message)
            if entry is None or not self.store.put(key, entry):
                outcome, entry = StoreOutcome.REFUSED, None
        superseded = entry is None and isinstance(message, dict) and current  # the old config's word ends nothing
        if superseded:
            self.store.supersede(key)  # an entry kept stale must not outlive this answer
        self.metrics.cache_stores.labels(upstream, method, outcome).inc()
        self.backoff.succeeded(key)  # the upstream answered, stored or not
        if entry is not None:
            self.refresh_backoff.succeeded(key)
        if self.shared is not None:
            if flight is not None:
                self.shared.finish(flight, key, entry, supersede=superseded)  # written, unlocked, "done"
            elif entry is not None:
                self.shared.share(key, entry)
            elif superseded:
                self.shared.supersede(key)
        return outcome, entry

    def build(self, upstream: str, message: dict[str, Any]) -> CacheEntry | None:
        """The entry of ``upstream``'s storable ``message``, with its stale window and refresh
        point (``None``: its lifetime is already over)."""
        stale_if_error_ms, refresh_ahead = self.entry_options[upstream]
        return build_entry(
            message, self.clock(), self.max_ttl_ms, stale_if_error_ms=stale_if_error_ms, refresh_ahead=refresh_ahead
        )

    # -- refresh-ahead ------------------------------------------------------------------------

    def refresh(self, key: CacheKey, fetch: Callable[[], Awaitable[Answer]], *, timeout_s: float, method: str) -> bool:
        """Fetch ``key`` again in the background (its entry is in the last part of its lifetime)
        with ``fetch`` (the upstream's whole answer), unless a fetch of it is under way (it leads
        the key: a miss meanwhile waits for it) or it is backing off. Returns whether it started.
        Nothing of a refresh reaches a caller but the entry it stores."""
        if key in self.coalescer or (self.drops and not self.current(key.upstream)):
            return False  # under way already (every hit until it ends comes here), or of an old config
        now = self.clock()
        if self.backoff.waiting(key, now) or self.refresh_backoff.waiting(key, now):
            return False
        self.coalescer.claim(key)  # leads it: checked above, and nothing awaited since
        self.refreshes.spawn(self._refresh(Lead(self, key, leading=True), fetch, timeout_s, method), name="refresh")
        return True

    async def _refresh(self, lead: Lead, fetch: Callable[[], Awaitable[Answer]], timeout_s: float, method: str) -> None:
        key = lead.key
        outcome = "failed"
        try:
            if self.shared is not None:
                # One refresh per key per cluster: the cold key's lock.
                found = await self.shared.lookup(key, timeout_s, refresh=True)
                if found.entry is not None:  # another process refreshed it: adopted from Redis
                    outcome = "shared"
                    if self.store.purges_of(key.upstream) == lead.purges and self.store.put(key, found.entry):
                        lead.release(found.entry)
                    return
                if found.skipped:  # another process refreshes it and its answer did not come
                    outcome = "skipped"
                    return
                lead.flight = found.flight
            try:
                status, message, size = await fetch()
            except (*self.failures, *self.busy) as err:
                log.info("refresh-ahead of a %s entry of %s failed: %s", method, key.upstream, err)
                if isinstance(err, self.failures):  # busy is no failure: no backoff
                    self.backoff.failed(key, self.clock())
                stale = self.store.stale(key)  # it may have expired meanwhile
                lead.release(None if stale is None else Stale(stale))
                return
            _, entry = lead.keep(status, message, size, method)
            if entry is None:
                outcome = "unstored"
                self.refresh_backoff.failed(key, self.clock())  # not refreshed again for a while
                return
            outcome = "stored"
        finally:
            lead.close()
            self.metrics.cache_refreshes.labels(key.upstream, method, outcome).inc()

    async def close(self) -> None:
        """Cancel the refreshes under way (the app's shutdown)."""
        await self.refreshes.close()
