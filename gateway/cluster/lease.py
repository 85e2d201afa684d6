"""Leases: at most one process in the cluster does a job (probe an upstream and hold its listen
stream), and another takes over when it dies.

A lease is a redis-py ``Lock`` named ``<key_prefix>:lease:<job>`` (``<job>``: the upstream's
name and identity, ``<name>:<identity>``, so that processes configured differently for an
upstream each probe it their own way) with an expiry of
:data:`LEASE_TTL_S`, renewed every :data:`RENEW_S` by its holder; the others try to take it as
often. A dead holder's lease expires, so a survivor holds it within ``LEASE_TTL_S + RENEW_S``
(13 s). A lease key without expiry was written over: it is removed. While Redis is down, every
process holds every lease itself (each upstream is then probed by every replica, as without
``[cluster]``); when Redis returns, one keeps each lease and the others let go. A reload changes
the jobs (:meth:`Leases.update`): the lease of a job gone, or renamed (another identity), is
given up in the next round, which starts at once, so that another replica on the old config
takes it over within ``RENEW_S`` rather than after its expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        self.ttl_s = ttl_s
        self._names: dict[str, str] = {}
        self._locks: dict[str, Lock] = {}
        #: Whether this process does each job now.
        self.doing: dict[str, bool] = {}
        self._owned: dict[str, bool] = {}
        #: Leases of jobs gone (:meth:`update`) that this process may hold: given up next round.
        self._retired: list[Lock] = []
        self._wake = asyncio.Event()
        self.update({job: (names or {}).get(job, job) for job in jobs})

    def update(self, names: Mapping[str, str]) -> None:
        """Do the jobs of ``names`` (job → its name in Redis) from now on: a job gone, or under
        another name (an upstream whose identity a reload changed), stops being done here and
        its lease is given up in the next round, which starts at once; a new one is tried then.
        ``on_change`` is not called for the jobs that go: their owner stopped them already."""
        for job in list(self._locks):
            if job not in names or self._names[job] != self.link.key("lease", names[job]):
                if self._owned[job]:
                    self._retired.append(self._locks[job])
                for table in (self._names, self._locks, self.doing, self._owned):
                    del table[job]
        for job, name in names.items():
            if job in self._locks:
                continue
            self._names[job] = self.link.key("lease", name)
            self._locks[job] = Lock(
                self.link.client, self._names[job], timeout=self.ttl_s, blocking=False, thread_local=False
            )
            self.doing[job] = self._owned[job] = False
            if self._held_in_redis is not None:
                self._held_in_redis(job, False)  # every series there from the start
        self._wake.set()

    async def run(self) -> None:
        """Take, renew and give up leases until cancelled."""
        try:
            # At start, give Redis a moment: otherwise every process begins by doing every job.
            async with asyncio.timeout(STARTUP_WAIT_S):
                await self.link.answering.wait()
        except TimeoutError:
            pass
        while True:
            self._wake.clear()
            while self._retired:
                await self._give_up(self._retired.pop())
            for job in list(self._locks):
                if job in self._locks:  # not gone meanwhile
                    await self.step(job)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.renew_s):
                    await self._wake.wait()

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
                if not owned and self._locks.get(job) is lock:
                    await self._clear_if_written_over(job)
        except Unavailable:
            # Unknown for now: keep doing what this process did until the feed decides.
            return
        if self._locks.get(job) is not lock:  # gone while Redis answered (update)
            if owned:
                self._retired.append(lock)
            return
        self._own(job, owned)
        self._do(job, owned)

    async def _give_up(self, lock: Lock) -> None:
        try:
            await self.link.run("lease", lock.release)
        except (Unavailable, LockError):
            pass  # not ours any more, or Redis is away: it expires within ttl_s

    async def release_all(self) -> None:
        """Give up every lease held (on shutdown: another replica takes over at once)."""
        while self._retired:
            await self._give_up(self._retired.pop())
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
