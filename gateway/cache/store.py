"""The store behind the cache: a small interface, and the in-process store on cachetools.

Another store (a shared one) implements :class:`CacheStore`; nothing outside ``gateway.cache``
knows which store it talks to.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Protocol

from cachetools import TLRUCache

from .keys import CacheKey
from .policy import CacheEntry, Invalidation

__all__ = ["CacheStore", "Clock", "EvictionListener", "MemoryStore", "PurgeListener"]

#: Seconds on a monotonic scale (``time.monotonic`` in production, a fake clock in tests).
Clock = Callable[[], float]
#: Called with an eviction reason (``expired``, ``size``, ``purge``, ``notification``, ...) and a count.
EvictionListener = Callable[[str, int], None]
#: Called with every purge's ``(predicate, reason)``, whatever it removed.
PurgeListener = Callable[[Callable[[CacheKey], bool], str], None]


class CacheStore(Protocol):
    """The store behind the cache. Implementations bound themselves and report evictions."""

    def get(self, key: CacheKey) -> CacheEntry | None:
        """The fresh entry for ``key``, or ``None``."""

    def stale(self, key: CacheKey) -> CacheEntry | None:
        """The entry for ``key`` if it expired and is still kept (stale-if-error), or ``None``."""

    def supersede(self, key: CacheKey) -> None:
        """The upstream's newest answer for ``key`` may not be stored (private, ...): its entry
        is no longer kept past expiry nor refreshed, and goes now if it expired."""

    @property
    def purges(self) -> int:
        """How many purges there were (a fetch started before one must not store its answer)."""

    def purges_of(self, upstream: str) -> int:
        """How many purges there were that may have removed an entry of ``upstream``: those of
        every upstream, and its own (a purge of another upstream does not stop it storing)."""

    @property
    def held(self) -> bool:
        """Whether the store is held (:meth:`hold`): it stores nothing."""

    def hold(self, held: bool) -> None:
        """Store nothing while ``held`` (what would be stored could not be vouched for: the
        shared tier cannot carry invalidations); entries already in are the caller's to purge."""

    def put(self, key: CacheKey, entry: CacheEntry) -> bool:
        """Store ``entry``; ``False`` if it was refused (caching disabled, held, too big, expired)."""

    def put_stale(self, key: CacheKey, entry: CacheEntry) -> bool:
        """Store an expired ``entry`` still in its stale window (read from the shared tier), for
        :meth:`stale` only, unless the key has an entry here; ``False`` if it was refused."""

    def purge(self, predicate: Callable[[CacheKey], bool], reason: str) -> int:
        """Remove every entry whose key matches; returns how many."""

    def discard(self, key: CacheKey) -> bool:
        """Remove ``key``'s entry to make room (an eviction, counted as ``size``; no purge: a
        fetch under way may still store its answer). Returns whether there was one."""

    def keys(self) -> list[CacheKey]:
        """The keys of the entries (stale ones kept included), a snapshot."""

    def __len__(self) -> int: ...

    @property
    def total_bytes(self) -> int:
        """Sum of the stored entries' sizes, in bytes."""


class _Entries(TLRUCache[CacheKey, CacheEntry]):
    """cachetools' time-aware LRU, bounded in bytes (``getsizeof``: an entry's size), counting
    the entries it evicts to make room (``popitem``); an entry lives until ``keep_until``
    (``keep_stale``) or ``expires_at``."""

    def __init__(self, max_bytes: int, clock: Clock, keep_stale: bool) -> None:
        ttu = _keep_until if keep_stale else _expires_at
        super().__init__(maxsize=max_bytes, ttu=ttu, timer=clock, getsizeof=_size)
        self.evicted = 0

    def popitem(self) -> tuple[CacheKey, CacheEntry]:
        item = super().popitem()
        self.evicted += 1
        return item


def _expires_at(_key: CacheKey, entry: CacheEntry, _now: float) -> float:
    return entry.expires_at


def _keep_until(_key: CacheKey, entry: CacheEntry, _now: float) -> float:
    return entry.keep_until


def _size(entry: CacheEntry) -> int:
    return entry.size


class MemoryStore:
    """In-process store: per-entry expiry, least-recently-used eviction (cachetools ``TLRUCache``).

    Bounded by ``max_entries`` entries and ``max_bytes`` bytes in total; ``clock`` gives seconds.
    An entry is no hit from ``expires_at`` on (``clock() >= expires_at``), and gone then, or with
    ``keep_stale`` (some upstream has ``stale_if_error_ms``) from its ``keep_until`` on: until
    then :meth:`stale` finds it, and it counts against both bounds like any other.
    ``on_evict(reason, count)`` hears of ``expired`` entries (counted by the next miss, put,
    purge, ``len()`` or ``total_bytes`` that finds them), ``size`` evictions and purges (under
    the purge's reason). ``on_purge(predicate, reason)`` hears of every purge, whatever it
    removed: the one place every invalidation of this process passes (local, other workers',
    other replicas', the shared tier's loss).
    """

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        clock: Clock,
        on_evict: EvictionListener | None = None,
        on_purge: PurgeListener | None = None,
        keep_stale: bool = False,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._on_evict = on_evict
        self._clock = clock
        self._entries = _Entries(max_bytes, clock, keep_stale)
        self._keep_stale = keep_stale
        self._purges = 0
        self._held = False
        #: Purges that may remove any upstream's entries, and those of one upstream (an
        #: Invalidation naming it), by name.
        self._purges_of_all = 0
        self._purges_by_upstream: dict[str, int] = {}
        self._on_purge = on_purge
        if keep_stale:
            # Decided once: without stale entries, a hit costs no freshness check of its own
            # (the TLRU cache's expiry is the entry's).
            self.get = self._get_fresh  # type: ignore[method-assign]

    def _evicted(self, reason: str, count: int) -> None:
        if count and self._on_evict is not None:
            self._on_evict(reason, count)

    def _expire(self) -> None:
        self._evicted("expired", len(self._entries.expire()))

    def get(self, key: CacheKey) -> CacheEntry | None:
        try:
            return self._entries[key]  # a hit: no expiry sweep on the hot path
        except KeyError:
            self._expire()
            return None

    def _get_fresh(self, key: CacheKey) -> CacheEntry | None:
        """:meth:`get` of a store that keeps entries past expiry."""
        try:
            entry = self._entries[key]
        except KeyError:
            self._expire()
            return None
        if entry.keep_until > entry.expires_at and entry.expires_at <= self._entries.timer():
            return None  # kept only to answer if fetching it again fails
        return entry

    def stale(self, key: CacheKey) -> CacheEntry | None:
        try:
            entry = self._entries[key]
        except KeyError:
            return None
        return entry if entry.expires_at <= self._entries.timer() else None

    def supersede(self, key: CacheKey) -> None:
        entries = self._entries
        entry = entries.get(key)
        if entry is None or (entry.keep_until == entry.expires_at and entry.refresh_at == math.inf):
            return
        self._expire()
        if entry.expires_at <= entries.timer():
            entries.pop(key, None)
            self._evicted("superseded", 1)
        else:
            entries[key] = dataclasses.replace(entry, keep_until=entry.expires_at, refresh_at=math.inf)

    @property
    def purges(self) -> int:
        return self._purges

    def purges_of(self, upstream: str) -> int:
        return self._purges_of_all + self._purges_by_upstream.get(upstream, 0)

    @property
    def held(self) -> bool:
        return self._held

    def hold(self, held: bool) -> None:
        self._held = held

    def put(self, key: CacheKey, entry: CacheEntry) -> bool:
        if self._max_entries == 0 or entry.size > self._max_bytes or self._held:
            return False
        entries = self._entries
        self._expire()
        if entry.expires_at <= entries.timer():
            return False
        entries.pop(key, None)
        entries.evicted = 0
        while len(entries) >= self._max_entries:
            entries.popitem()
        entries[key] = entry  # evicts least recently used entries until the bytes fit
        self._evicted("size", entries.evicted)
        return True

    def put_stale(self, key: CacheKey, entry: CacheEntry) -> bool:
        entries = self._entries
        if not self._keep_stale or entry.keep_until <= entries.timer() or key in entries:
            return False  # the local tier keeps no stale entries, or holds one of its own
        if self._max_entries == 0 or entry.size > self._max_bytes or self._held:
            return False
        entries.evicted = 0
        while len(entries) >= self._max_entries:
            entries.popitem()
        entries[key] = entry
        self._evicted("size", entries.evicted)
        return True

    def resize(self, *, max_entries: int, max_bytes: int, keep_stale: bool) -> int:
        """New bounds (a reload): least recently used entries are evicted at once until both
        hold (counted as ``size`` evictions); ``keep_stale`` as in the constructor (without it,
        expired entries kept stale go). Returns how many entries were evicted."""
        before = len(self)
        if max_bytes != self._max_bytes or keep_stale != self._keep_stale:
            old, self._entries = self._entries, _Entries(max_bytes, self._clock, keep_stale)
            while True:  # least recently used first, so that the new container keeps the order
                try:
                    key, entry = TLRUCache.popitem(old)
                except KeyError:
                    break
                if entry.size <= max_bytes and (keep_stale or entry.expires_at > old.timer()):
                    self._entries[key] = entry  # evicts least recently used ones until the bytes fit
            self._max_bytes = max_bytes
            self._keep_stale = keep_stale
            if keep_stale:
                self.get = self._get_fresh  # type: ignore[method-assign]
            else:
                vars(self).pop("get", None)  # the class's own get again
        self._max_entries = max_entries
        entries = self._entries
        while len(entries) > max_entries:
            TLRUCache.popitem(entries)
        evicted = before - len(entries)
        self._evicted("size", evicted)
        return evicted

    def purge(self, predicate: Callable[[CacheKey], bool], reason: str) -> int:
        self._purges += 1
        if isinstance(predicate, Invalidation) and predicate.upstream is not None:
            named = predicate.upstream
            self._purges_by_upstream[named] = self._purges_by_upstream.get(named, 0) + 1
        else:
            self._purges_of_all += 1
        self._expire()
        doomed = [k for k in self._entries if predicate(k)]
        for k in doomed:
            self._entries.pop(k, None)
        self._evicted(reason, len(doomed))
        if self._on_purge is not None:
            self._on_purge(predicate, reason)
        return len(doomed)

    def discard(self, key: CacheKey) -> bool:
        found = self._entries.pop(key, None) is not None
        if found:
            self._evicted("size", 1)
        return found

    def keys(self) -> list[CacheKey]:
        return list(self._entries)

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        self._expire()
        return int(self._entries.currsize)
