"""Invalidations Redis has not taken yet: kept, fenced, and sent again until they get through.

An invalidation reaches the cluster when its generations are raised
(:meth:`~gateway.cluster.generations.Generations.bump`) and its event is on the feed
(:mod:`gateway.cluster.feed`). When either is refused or times out (Redis full, paused, down),
the invalidation waits here, and the shared tier is ``read_only`` (:mod:`gateway.cluster.link`:
every other process then stops serving cached answers by itself, having no way to hear this
one). Until it got through, this process neither reads nor writes shared entries of the
(upstream, method) pairs it touches (:attr:`Outbox.fenced`): it never serves the entry it
invalidated, not even from Redis. Pending invalidations are sent again, oldest first, before
the shared tier is ``up`` again (:meth:`Outbox.flush`, the link's ``before_writable``).

At most :data:`MAX_PENDING` wait: past it they become one invalidation of everything (what
they all removed, and more), so a purge storm while Redis is away holds a bounded list.
``mcp_gateway_cluster_invalidations_pending`` is how many wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..cache import Invalidation
from ..telemetry import GatewayMetrics
from .feed import Feed
from .generations import Generations
from .link import RedisLink, Unavailable

__all__ = ["MAX_PENDING", "Outbox", "Pending"]

log = logging.getLogger("mcp_gateway.cluster")

#: Invalidations kept at most; past it they are merged into one of everything.
MAX_PENDING: Final = 64


@dataclass(slots=True)
class Pending:
    """An invalidation on its way: the ``methods`` of ``upstreams`` whose generations it raises
    (``fields``: their names, :meth:`~gateway.cluster.generations.Generations.field`),
    ``generations`` their raised values once Redis took the raise (it is then only published).
    ``echo``: raised for another configuration's invalidation of the same upstream (see
    :meth:`gateway.cluster.node.Cluster._event`), which nobody echoes again."""

    invalidation: Invalidation
    reason: str
    upstreams: list[str]
    methods: list[str]
    fields: list[str]
    generations: dict[str, int] | None = None
    echo: bool = False


class Outbox:
    """This process's invalidations on their way to the cluster (see the module). ``scope(inv)``
    is the (upstreams, methods) whose generations ``inv`` raises (for an invalidation of
    everything: all of them); ``delivered(p)`` runs for each pending one that got through late
    (to drop what was stored meanwhile)."""

    def __init__(
        self,
        link: RedisLink,
        generations: Generations,
        feed: Feed,
        metrics: GatewayMetrics,
        *,
        origin: str,
        scope: Callable[[Invalidation], tuple[list[str], list[str]]],
        delivered: Callable[[Pending], None],
    ) -> None:
        self.link = link
        self.generations = generations
        self.feed = feed
        self.metrics = metrics
        self.origin = origin
        self.scope = scope
        self._delivered = delivered
        self.pending: list[Pending] = []
        #: The fields of what waits: no shared entry of them is read or written here meanwhile.
        self.fenced: set[str] = set()
        self._flushing = asyncio.Lock()
        metrics.cluster_invalidations_pending.set(0)

    def __len__(self) -> int:
        return len(self.pending)

    def pending_for(
        self, invalidation: Invalidation, reason: str, upstreams: list[str], methods: list[str], *, echo: bool = False
    ) -> Pending:
        """``invalidation`` as it waits: with the names of the generations it raises."""
        fields = [self.generations.field(u, m) for u in upstreams for m in methods]
        return Pending(invalidation, reason, upstreams, methods, fields, echo=echo)

    async def send(
        self, invalidation: Invalidation, reason: str, upstreams: list[str], methods: list[str], *, echo: bool = False
    ) -> bool:
        """Raise the ``methods`` of ``upstreams`` and publish ``invalidation`` now; whether it got through. If not
        (or the shared tier is not up: not tried), it is kept, fenced, and the shared tier is
        ``read_only`` (a refused or timed-out invalidation is a write that did not go through)."""
        pending = self.pending_for(invalidation, reason, upstreams, methods, echo=echo)
        if self.link.up and not self.pending and await self._try(pending, force=False):
            return True
        self._keep(pending)
        return False

    async def flush(self) -> bool:
        """Send what waits, oldest first, even while the shared tier is not up; whether nothing
        is left. One flush at a time (a pending invalidation is never sent twice at once)."""
        async with self._flushing:
            while self.pending and await self._try(self.pending[0], force=True):
                done = self.pending.pop(0)
                self._delivered(done)
                log.info("shared tier: the invalidation (%s) got through", done.reason)
            self._settle()
            return not self.pending

    def _keep(self, pending: Pending) -> None:
        if len(self.pending) >= MAX_PENDING:
            purged = pending.reason == "purge" or any(p.reason == "purge" for p in self.pending)
            reason = "purge" if purged else pending.reason
            log.warning("shared tier: over %d invalidations waiting; merged into one of everything", MAX_PENDING)
            everything = Invalidation()
            self.pending = [self.pending_for(everything, reason, *self.scope(everything))]
        else:
            self.pending.append(pending)
        self._settle()
        log.warning(_UNPUBLISHED, pending.reason)

    def _settle(self) -> None:
        self.fenced = {f for p in self.pending for f in p.fields}
        self.metrics.cluster_invalidations_pending.set(len(self.pending))

    async def _try(self, pending: Pending, *, force: bool) -> bool:
        """Raise (once) and publish ``pending``; whether both went through. A failure makes
        the shared tier ``read_only`` at once."""
        try:
            if pending.generations is None:
                pending.generations = await self.generations.bump(pending.upstreams, pending.methods, force=force)
            await self.feed.publish(
                {
                    "type": "invalidate",
                    "invalidation": pending.invalidation.to_json(),
                    "reason": pending.reason,
                    "generations": pending.generations,
                    "origin": self.origin,
                    "echo": pending.echo,
                },
                force=force,
            )
        except Unavailable as exc:
            if self.link.reading:
                self.link.refused(str(exc))
            return False
        return True


_UNPUBLISHED: Final = (
    "shared tier: could not publish an invalidation (%s); kept until Redis takes it (meanwhile no "
    "replica that reads Redis answers from its cache)"
)
