"""Callers waiting for a cold key's leader in another process (single flight across the
cluster, :mod:`gateway.cluster.node`): each wait is a future, resolved by the leader's ``done``
event on the feed, or with ``False`` when the feed is lost (they then go upstream alone)."""

from __future__ import annotations

import asyncio

__all__ = ["Waiters"]


class Waiters:
    """The waits of this process, by the key's Redis name (``<generation>:<digest>``)."""

    def __init__(self) -> None:
        self._futures: dict[str, list[asyncio.Future[bool]]] = {}

    def expect(self, ident: str) -> asyncio.Future[bool]:
        """A future that :meth:`done` for ``ident`` resolves with whether an entry was stored.
        Registered before the lock is tried, so that a ``done`` after the try is never missed."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._futures.setdefault(ident, []).append(fut)
        return fut

    def forget(self, ident: str, fut: asyncio.Future[bool]) -> None:
        """The wait ``fut`` for ``ident`` is over (answered, timed out or not needed)."""
        futures = self._futures.get(ident)
        if futures is not None:
            if fut in futures:
                futures.remove(fut)
            if not futures:
                del self._futures[ident]

    def done(self, ident: object, stored: bool) -> None:
        """The leader of ``ident`` finished (``stored``: an entry is in Redis)."""
        for fut in self._futures.get(ident, ()) if isinstance(ident, str) else ():
            if not fut.done():
                fut.set_result(stored)

    def release_all(self) -> None:
        """Every wait ends with ``False`` (the feed was lost: no ``done`` can be trusted to come)."""
        for futures in self._futures.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(False)
        self._futures.clear()
