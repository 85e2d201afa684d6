"""Single flight across processes: what a shared-tier lookup gives, and the cold key's lock.

The lock is a redis-py ``Lock`` named ``<key_prefix>:lock:<generation>:<digest>``
(:mod:`gateway.cluster.node`), with an expiry: one without expiry is not a lock this gateway
took (a value written over it), and is removed so that the next caller can lead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from redis.asyncio.lock import Lock
from redis.exceptions import LockError

from ..cache import CacheEntry
from .link import RedisLink, Unavailable

__all__ = ["Flight", "Lookup", "lock_is_live", "release_quietly"]

log = logging.getLogger("mcp_gateway.cluster")


@dataclass(slots=True)
class Flight:
    """This process leads a cold key for the cluster: finish it with :meth:`~gateway.cluster.Cluster.finish`."""

    ident: str
    lock: Lock
    finished: bool = False


@dataclass(slots=True)
class Lookup:
    """What the shared tier gave for a local miss: an ``entry`` (``collapsed``: it is the
    answer another process's leader just fetched), or the ``flight`` to lead, or neither (go
    upstream alone). ``stale``: an expired shared entry still in its stale window (only to
    answer from if fetching fails). ``skipped`` (refresh only): another process leads the key
    and its answer did not come; this process does not refresh it."""

    entry: CacheEntry | None = None
    collapsed: bool = False
    flight: Flight | None = None
    stale: CacheEntry | None = None
    skipped: bool = False


async def lock_is_live(link: RedisLink, ident: str) -> bool:
    """Whether the lock of the key named ``ident`` is one a leader holds (it has an expiry);
    removes one that has none. ``False`` too when Redis fails (the caller goes alone)."""
    name = link.key("lock", ident)
    try:
        ttl = await link.run("lock", lambda: link.client.pttl(name))
        if ttl == -1:
            log.warning("shared tier: %s has no expiry (written over?); removed", name)
            await link.run("lock", lambda: link.client.delete(name))
            return False
    except Unavailable:
        return False
    return True


async def release_quietly(link: RedisLink, lock: Lock) -> None:
    """Free ``lock``; one that expired already or is not ours any more, or a Redis that is away,
    is no matter: it expires by itself."""
    try:
        await link.run("unlock", lock.release)
    except (Unavailable, LockError):
        pass
