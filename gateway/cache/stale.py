"""Serving through upstream failures: the stale answer handed to coalesced followers, and the
per-key backoff that keeps a failing upstream from being asked again at once.

MCP 2026-07-28, server/utilities/caching, 'Freshness Calculation' lets a cache serve a stale
result when fetching it again fails; the rules for when (``stale_if_error_ms``: only a
transport failure or an answer that is not a JSON-RPC response, never in place of one the
upstream gave, never a private answer) are the gateway's (docs/cache.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

from .keys import CacheKey
from .policy import CacheEntry

if TYPE_CHECKING:  # the type only: gateway.errors is aiohttp's side, and this package has none
    from ..errors import GatewayError

__all__ = ["ABANDONED", "BACKOFF_BASE_S", "BACKOFF_MAX_S", "Abandoned", "Backoff", "Failed", "Stale"]

#: After a failed attempt on a key that has a stale entry, that entry answers without the
#: upstream being asked for this long, in seconds ...
BACKOFF_BASE_S: Final = 1.0
#: ... doubled by each failure in a row, up to this (a recovered upstream is seen within it).
BACKOFF_MAX_S: Final = 8.0
#: Keys remembered at most; beyond it the ones whose backoff ended go, then the oldest.
MAX_KEYS: Final = 4096


class Stale(NamedTuple):
    """What a coalescing leader whose fetch failed hands its followers: the expired entry they
    answer from (stale-if-error), instead of each going upstream."""

    entry: CacheEntry


class Failed(NamedTuple):
    """What a coalescing leader whose fetch failed, with no stale entry to answer from, hands its
    followers: the failure (a ``GatewayError``: the upstream unreachable, timed out, or not
    answering a JSON-RPC response), which they answer with their own id instead of each trying the
    same failing upstream at once."""

    error: GatewayError


class Abandoned:
    """What a coalescing leader that stopped before the upstream answered hands its followers
    (its caller went away, or its own request could not be sent): they read the key again, one
    of them leading, rather than each going upstream alone."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABANDONED"


#: The one :class:`Abandoned`.
ABANDONED: Final = Abandoned()


class Backoff:
    """Per key: when the upstream may next be asked after failures (clock seconds).

    :meth:`failed` after a failed attempt (the delay doubles from :data:`BACKOFF_BASE_S` to
    :data:`BACKOFF_MAX_S`), :meth:`succeeded` after an answer, :meth:`waiting` whether the key
    is still backing off at ``now``. Bounded to :data:`MAX_KEYS` keys.
    """

    def __init__(self) -> None:
        #: key -> (retry at, current delay in seconds)
        self._keys: dict[CacheKey, tuple[float, float]] = {}

    def waiting(self, key: CacheKey, now: float) -> bool:
        state = self._keys.get(key)
        return state is not None and now < state[0]

    def failed(self, key: CacheKey, now: float) -> None:
        state = self._keys.pop(key, None)
        delay = BACKOFF_BASE_S if state is None else min(state[1] * 2, BACKOFF_MAX_S)
        if len(self._keys) >= MAX_KEYS:
            self._prune(now)
        self._keys[key] = (now + delay, delay)

    def succeeded(self, key: CacheKey) -> None:
        self._keys.pop(key, None)

    def _prune(self, now: float) -> None:
        self._keys = {k: v for k, v in self._keys.items() if now < v[0]}
        while len(self._keys) >= MAX_KEYS:
            del self._keys[next(iter(self._keys))]  # the oldest failure first

    def __len__(self) -> int:
        return len(self._keys)
