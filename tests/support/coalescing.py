"""Who waits on a coalescing leader: the state a test polls for (:func:`.polling.wait_until`)
before it makes the leader go away, in place of a fixed pause."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.app import PROXY
from gateway.cache import CacheKey

from .running import RunningGateway


class Followers:
    """The requests to ``gw`` that join a leader from now on: each claim of a key that another
    request leads (``Coalescer.claim`` returned the leader's future). A request counted here is
    already waiting on its leader: the read-through awaits that future in the same step as its
    claim (gateway/cache/readthrough.py, ``ReadThrough.read``)."""

    def __init__(self, gw: RunningGateway) -> None:
        coalescer = gw.app[PROXY].readthrough.coalescer  # one for every generation (reloads copy it)
        claim = coalescer.claim
        self.futures: list[asyncio.Future[Any]] = []

        def counted(key: CacheKey) -> asyncio.Future[Any] | None:
            future = claim(key)
            if future is not None:
                self.futures.append(future)
            return future

        coalescer.claim = counted  # type: ignore[method-assign]

    def waiting(self) -> int:
        """How many joined a leader that has not published its outcome yet."""
        return sum(not future.done() for future in self.futures)
