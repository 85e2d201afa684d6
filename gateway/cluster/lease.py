"""Leases: at most one process in the cluster does a job (probe an upstream and hold its listen
stream), and another takes over when it dies.

A lease is a redis-py ``Lock`` named ``<key_prefix>:lease:<job>`` (``<job>``: the upstream's
name and identity, ``<name>:<identity>``, so that processes configured differently for an
upstream each probe it their own way) with an expiry of
:data:`LEASE_TTL_S`, renewed every :data:`RENEW_S` by its holder; the others try to take it as
often. A dead holder's lease expires, so a survivor holds it within ``LEASE_TTL_S + RENEW_S``
(13 s). A lease key without expiry was written over: it is removed. While Redis is down, every
process holds every lease itself (each upstream is then probed by every replica, as without
``[cluster]``); when Redis returns, one keeps each lease and the others let go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from redis.asyncio.lock import Lock
from redis.exceptions import LockError

from .link import RedisLink, Unavailable

__all__ = ["LEASE_TTL_S", "RENEW_S", "Leases"]

log = logging.getLogger("mcp_gateway.cluster")

#: A lease's lifetime without renewal, in seconds.
LEASE_TTL_S: Final = 10.0
#: How long a starting process waits for Redis before doing every job itself, in seconds.
STARTUP_WAIT_S: Final = 2.0
#: How often a holder renews, and the others try to take a lease, in seconds.
RENEW_S: Final = 3.0


class Leases:
    """The leases on ``jobs`` for this process. ``on_change(job, held)`` is called each time this
    process starts (``True``) or stops (``False``) doing ``job``; ``held_in_redis(job, held)``
    reports whether the lease is held through Redis (the ``cluster_leases_held`` gauge).
    ``names``: each job's name in Redis (default: the job itself)."""

    def __init__(
        self,
        link: RedisLink,
        jobs: Iterable[str],
        on_change: Callable[[str, bool], None],
        *,
        names: Mapping[str, str] | None = None,
        held_in_redis: Callable[[str, bool], None] | None = None,
        renew_s: float = RENEW_S,
        ttl_s: float = LEASE_TTL_S,
    ) -> None:
        self.link = link
        self.renew_s = renew_s
        self._on_change = on_change
        self._held_in_redis = held_in_redis
        self._names = {job: link.key("lease", (names or {}).get(job, job)) for job in jobs}
        self._locks = {
            job: Lock(link.client, name, timeout=ttl_s, blocking=False, thread_local=False)
            for job, name in self._names.items()
        }
        #: Whether this process does each job now.
        self.doing: dict[str, bool] = dict.fromkeys(self._locks, False)
        self._owned: dict[str, bool] = dict.fromkeys(self._locks, False)
        if held_in_redis is not None:
            for job in self._locks:
                held_in_redis(job, False)  # every series there from the start

    async def run(self) -> None:
        """Take, renew and give up leases until cancelled."""
        try:
            # At start, give Redis a moment: otherwise every process begins by doing every job.
            async with asyncio.timeout(STARTUP_WAIT_S):
                await self.link.answering.wait()
        except TimeoutError:
            pass
        while True:
            for job in self._locks:
                await self.step(job)
            await asyncio.sleep(self.renew_s)

    async def step(self, job: str) -> None:
        """One round for ``job``: renew or try to take its lease (or, Redis down, do it anyway)."""
        lock = self._locks[job]
        if not self.link.up:
            self._own(job, False)
            self._do(job, True)  # no one to agree with: every process does its own
            return
        try:
            if self._owned[job]:
                try:
                    await self.link.run("lease", lock.reacquire)
                    owned = True
                except LockError:  # expired and taken by another (this process stalled)
                    owned = False
            else:
                owned = await self.link.run("lease", lock.acquire)
                if not owned:
                    await self._clear_if_written_over(job)
        except Unavailable:
            # Unknown for now: keep doing what this process did until the feed decides.
            return
        self._own(job, owned)
        self._do(job, owned)

    async def release_all(self) -> None:
        """Give up every lease held (on shutdown: another replica takes over at once)."""
        for job, lock in self._locks.items():
            if self._owned[job]:
                try:
                    await self.link.run("lease", lock.release)
                except (Unavailable, LockError):
                    pass
                self._own(job, False)

    async def _clear_if_written_over(self, job: str) -> None:
        name = self._names[job]
        if await self.link.run("lease", lambda: self.link.client.pttl(name)) == -1:
            log.warning("shared tier: %s has no expiry (written over?); removed", name)
            await self.link.run("lease", lambda: self.link.client.delete(name))

    def _own(self, job: str, owned: bool) -> None:
        if owned != self._owned[job]:
            self._owned[job] = owned
            if self._held_in_redis is not None:
                self._held_in_redis(job, owned)

    def _do(self, job: str, doing: bool) -> None:
        if doing != self.doing[job]:
            self.doing[job] = doing
            if not doing:
                log.info("upstream %s: another replica probes it for the cluster now", job)
            elif self.link.up:
                log.info("upstream %s: this replica probes it for the cluster", job)
            else:
                log.info("upstream %s: probing it here (shared tier %s)", job, self.link.state.replace("_", "-"))
            self._on_change(job, doing)
