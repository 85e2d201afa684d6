"""Where this process's invalidations go: the one fan-out of purges and list changes.

An invalidation made here (an admin purge, a list-changed notification, a lost listen stream)
goes to the other workers of this ``--workers`` group through their bus
(:mod:`gateway.cluster.workers`), and then either through the shared tier to every replica
(:class:`~gateway.cluster.Cluster`: the local entries at once, the others through Redis) or,
without ``[cluster]``, to this process's store alone. The bus carries it with ``[cluster]`` too,
so that a purge reaches this group's workers even while Redis is down.

Invalidations that reach this process from elsewhere (the bus, the cluster's feed) are applied
to the store where they arrive; the store tells its purge listener of every one
(:class:`~gateway.cache.MemoryStore`, ``on_purge``).
"""

from __future__ import annotations

from ..cache import CacheStore, Invalidation
from .node import Cluster, Spread
from .workers import WorkerBus

__all__ = ["Invalidator"]


class Invalidator:
    """Sends this process's invalidations everywhere they must go (see the module): ``bus``,
    this worker group's (``None``: one process), and ``cluster`` (``None``: no ``[cluster]``,
    ``store`` alone)."""

    def __init__(self, store: CacheStore, *, cluster: Cluster | None = None, bus: WorkerBus | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self.bus = bus

    def invalidate_soon(self, invalidation: Invalidation, reason: str) -> int:
        """For callers that cannot wait (a notification, a lost stream): this process's matching
        entries go now and their count is returned; the other workers and replicas are told in
        the background (Redis failures wait in the cluster's outbox, never raised)."""
        if self.bus is not None:
            self.bus.broadcast(invalidation, reason)
        if self.cluster is not None:
            return self.cluster.invalidate_soon(invalidation, reason)
        return self.store.purge(invalidation, reason)

    async def invalidate(self, invalidation: Invalidation, reason: str) -> Spread:
        """For the admin purge: :meth:`invalidate_soon` that waits for the shared tier.
        ``count`` is this process's entries removed; ``delivered`` whether every replica and
        the shared tier have it (always true without ``[cluster]``; false: Redis did not take it,
        it waits in the outbox: :meth:`Cluster.invalidate <gateway.cluster.Cluster.invalidate>`)."""
        if self.bus is not None:
            self.bus.broadcast(invalidation, reason)
        if self.cluster is not None:
            return await self.cluster.invalidate(invalidation, reason)
        return Spread(self.store.purge(invalidation, reason), delivered=True)
