"""Coalescing: concurrent misses on one key make one upstream request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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

    def release(
        self,
        key: CacheKey,
        entry: CacheEntry | Stale | Failed | Abandoned | None,
        future: asyncio.Future[CacheEntry | Stale | Failed | Abandoned | None] | None = None,
    ) -> None:
        """Publish the leader's outcome for ``key`` to its followers; ``future`` (the leader's,
        :meth:`future_of` just after its claim) once its key may have been detached (:meth:`detach`): then
        only its own followers hear it, not those of a newer leader of the same key."""
        if future is None:
            future = self._inflight.pop(key, None)
        elif self._inflight.get(key) is future:
            del self._inflight[key]
        if future is not None and not future.done():
            future.set_result(entry)

    def future_of(self, key: CacheKey) -> asyncio.Future[CacheEntry | Stale | Failed | Abandoned | None] | None:
        """The future the followers of ``key``'s leader wait on."""
        return self._inflight.get(key)

    def detach(self, predicate: Callable[[CacheKey], bool]) -> int:
        """Let no new request join the leaders of the keys ``predicate`` matches (a reload changed
        their upstream: a request made after it must not get an answer fetched before it); their
        own followers still get their outcome. Returns how many."""
        keys = [key for key in self._inflight if predicate(key)]
        for key in keys:
            del self._inflight[key]
        return len(keys)

    def __contains__(self, key: object) -> bool:
        """Whether a request for ``key`` leads it now."""
        return key in self._inflight

    def __len__(self) -> int:
        return len(self._inflight)
