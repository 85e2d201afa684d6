"""The store behind the cache: a small interface, and the in-process store on cachetools.

Another store (a shared one) implements :class:`CacheStore`; nothing outside ``gateway.cache``
knows which store it talks to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cachetools import TLRUCache

from .keys import CacheKey
from .policy import CacheEntry

__all__ = ["CacheStore", "Clock", "EvictionListener", "MemoryStore"]

#: Seconds on a monotonic scale (``time.monotonic`` in production, a fake clock in tests).
Clock = Callable[[], float]
#: Called with an eviction reason (``expired``, ``size``, ``purge``, ``notification``, ...) and a count.
EvictionListener = Callable[[str, int], None]


class CacheStore(Protocol):
    """The store behind the cache. Implementations bound themselves and report evictions."""

    def get(self, key: CacheKey) -> CacheEntry | None:
        """The fresh entry for ``key``, or ``None``."""

    def put(self, key: CacheKey, entry: CacheEntry) -> bool:
        """Store ``entry``; ``False`` if it was refused (caching disabled, too big, expired)."""

    def purge(self, predicate: Callable[[CacheKey], bool], reason: str) -> int:
        """Remove every entry whose key matches; returns how many."""

    def keys(self) -> list[CacheKey]:
        """The keys of the fresh entries, a snapshot."""

    def __len__(self) -> int: ...

    @property
    def total_bytes(self) -> int:
        """Sum of the stored entries' sizes, in bytes."""


class _Entries(TLRUCache[CacheKey, CacheEntry]):
    """cachetools' time-aware LRU, bounded in bytes (``getsizeof``: an entry's size), counting
    the entries it evicts to make room (``popitem``)."""

    def __init__(self, max_bytes: int, clock: Clock) -> None:
        super().__init__(maxsize=max_bytes, ttu=_expires_at, timer=clock, getsizeof=_size)
        self.evicted = 0

    def popitem(self) -> tuple[CacheKey, CacheEntry]:
        item = super().popitem()
        self.evicted += 1
        return item


def _expires_at(_key: CacheKey, entry: CacheEntry, _now: float) -> float:
    return entry.expires_at


def _size(entry: CacheEntry) -> int:
    return entry.size


class MemoryStore:
    """In-process store: per-entry expiry, least-recently-used eviction (cachetools ``TLRUCache``).

    Bounded by ``max_entries`` entries and ``max_bytes`` bytes in total; ``clock`` gives seconds.
    An entry is gone from ``expires_at`` on (``clock() >= expires_at``). ``on_evict(reason,
    count)`` hears of ``expired`` entries (counted by the next miss, put, purge, ``len()`` or
    ``total_bytes`` that finds them), ``size`` evictions and purges (under the purge's reason).
    """

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        clock: Clock,
        on_evict: EvictionListener | None = None,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._on_evict = on_evict
        self._entries = _Entries(max_bytes, clock)

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

    def put(self, key: CacheKey, entry: CacheEntry) -> bool:
        if self._max_entries == 0 or entry.size > self._max_bytes:
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

    def purge(self, predicate: Callable[[CacheKey], bool], reason: str) -> int:
        self._expire()
        doomed = [k for k in self._entries if predicate(k)]
        for k in doomed:
            self._entries.pop(k, None)
        self._evicted(reason, len(doomed))
        return len(doomed)

    def keys(self) -> list[CacheKey]:
        return list(self._entries)

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        self._expire()
        return int(self._entries.currsize)
