"""Coalescing: concurrent misses on one key make one upstream request."""

from __future__ import annotations

import asyncio

from .keys import CacheKey
from .policy import CacheEntry
from .stale import Abandoned, Failed, Stale

__all__ = ["Coalescer"]


class Coalescer:
    """Collapses concurrent misses on one key into one upstream request (docs/cache.md).

    The first caller of :meth:`claim` for a key is the leader and must call
    :meth:`release` with the stored entry or ``None``; later callers get a future that
    resolves to that value. ``None`` tells followers to go upstream on their own (the
    answer was private, an error, or the leader gave up); a :class:`~gateway.cache.stale.Failed`
    that the leader could not fetch it (they answer its failure); a :class:`~gateway.cache.stale.Stale`
    entry, to answer from it stale (the leader's fetch failed: stale-if-error); an
    :class:`~gateway.cache.stale.Abandoned`, to read the key again (the leader stopped before an
    answer: one of them leads now). A background
    refresh (refresh-ahead) leads its key the same way.
    """

    def __init__(self) -> None:
        self._inflight: dict[CacheKey, asyncio.Future[CacheEntry | Stale | Failed | Abandoned | None]] = {}

    def claim(self, key: CacheKey) -> asyncio.Future[CacheEntry | Stale | Failed | Abandoned | None] | None:
        """``None`` if the caller now leads ``key``; else the leader's future to await."""
        fut = self._inflight.get(key)
        if fut is not None:
            return fut
        self._inflight[key] = asyncio.get_running_loop().create_future()
        return None

    def release(self, key: CacheKey, entry: CacheEntry | Stale | Failed | Abandoned | None) -> None:
        """Publish the leader's outcome for ``key`` to its followers."""
        fut = self._inflight.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(entry)

    def __contains__(self, key: object) -> bool:
        """Whether a request for ``key`` leads it now."""
        return key in self._inflight

    def __len__(self) -> int:
        return len(self._inflight)
