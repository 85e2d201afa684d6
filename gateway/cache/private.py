"""Private answers per identity (``[cache] private_per_identity``): a ``cacheScope: "private"``
answer kept for the authorization context of the caller it was given to, and no other.

MCP 2026-07-28, server/utilities/caching, 'Cache Scope Field': a ``private`` result may be reused
only for the same authorization context. Such an entry lives in the local store under its own
key (the public key with the caller's context in its ``authorization`` part), is never handed to
the shared tier, never outlives the token (``Caller.expires_at``), and each context holds at most
:data:`MAX_PRIVATE_PER_CONTEXT` entries (the oldest go first), all within ``max_entries``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from .keys import CacheKey
from .policy import CacheEntry, StoreOutcome, build_entry, store_outcome
from .store import CacheStore, Clock

__all__ = ["MAX_PRIVATE_CONTEXTS", "MAX_PRIVATE_PER_CONTEXT", "PRIVATE_PREFIX", "PrivateAnswers"]

#: Entries one authorization context may hold.
MAX_PRIVATE_PER_CONTEXT: Final = 256
#: Contexts whose entries are counted; past this the oldest context's entries go (a bound on
#: the bookkeeping, whatever the store holds).
MAX_PRIVATE_CONTEXTS: Final = 4096
#: Marks the ``authorization`` part of a private key (an upstream with ``forward_authorization``,
#: whose keys carry a hash there, is never one: that option and gateway auth exclude each other).
PRIVATE_PREFIX: Final = b"private:"


class PrivateAnswers:
    """The private entries of one store: keys, keeping, and the per-context bound.

    ``clock`` is the store's monotonic clock (seconds); ``wall`` gives seconds since the epoch,
    the scale of a token's ``exp``.
    """

    def __init__(
        self,
        store: CacheStore,
        clock: Clock,
        *,
        max_entry_bytes: int,
        max_ttl_ms: int,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.clock = clock
        self.wall = wall
        self.max_entry_bytes = max_entry_bytes
        self.max_ttl_ms = max_ttl_ms
        #: Per context, its keys, oldest first.
        self._keys: OrderedDict[bytes, OrderedDict[CacheKey, None]] = OrderedDict()

    @staticmethod
    def key(key: CacheKey, context: bytes) -> CacheKey:
        """``key``'s private twin for the authorization context ``context`` (32 bytes)."""
        return key._replace(authorization=PRIVATE_PREFIX + context)

    def keep(
        self,
        key: CacheKey,
        context: bytes,
        expires_at: float | None,
        status: int,
        message: object,
        size: int,
    ) -> CacheEntry | None:
        """Store ``message`` (``size`` bytes, HTTP ``status``), the upstream's answer to the public
        ``key``, for ``context`` alone when it is a complete, ``private`` result with a ``ttlMs``
        that fits ``max_entry_bytes``; for no longer than ``ttlMs`` (capped by ``max_ttl_ms``) nor
        past ``expires_at`` (the token's ``exp``, wall seconds). Returns the entry stored, if any."""
        if not context or not isinstance(message, dict) or not isinstance(message.get("result"), dict):
            return None
        result: dict[str, Any] = message["result"]
        if result.get("cacheScope") != "private":
            return None
        # The public rules but for the scope: complete, an integer ttlMs > 0, small enough.
        as_public = {**message, "result": {**result, "cacheScope": "public"}}
        if store_outcome(status, as_public, size, self.max_entry_bytes) is not StoreOutcome.STORED:
            return None
        now = self.clock()
        entry = build_entry(message, now, self.max_ttl_ms)
        if entry is None:
            return None
        if expires_at is not None:
            token_left = expires_at - self.wall()
            if token_left <= 0:
                return None
            if now + token_left < entry.expires_at:
                entry = dataclasses.replace(entry, expires_at=now + token_left, keep_until=now + token_left)
        private = self.key(key, context)
        if not self.store.put(private, entry):
            return None
        self._note(context, private)
        return entry

    def _note(self, context: bytes, key: CacheKey) -> None:
        keys = self._keys.get(context)
        if keys is None:
            keys = self._keys[context] = OrderedDict()
            if len(self._keys) > MAX_PRIVATE_CONTEXTS:
                _, oldest = self._keys.popitem(last=False)
                self._drop(oldest)
        else:
            self._keys.move_to_end(context)
        keys[key] = None
        keys.move_to_end(key)
        if len(keys) > MAX_PRIVATE_PER_CONTEXT:
            # Keys the store has evicted meanwhile are forgotten first: they hold no room.
            for stale in [k for k in keys if self.store.get(k) is None and self.store.stale(k) is None]:
                del keys[stale]
            while len(keys) > MAX_PRIVATE_PER_CONTEXT:
                oldest_key, _ = keys.popitem(last=False)
                self._drop({oldest_key: None})

    def _drop(self, keys: OrderedDict[CacheKey, None] | dict[CacheKey, None]) -> None:
        for key in keys:
            self.store.discard(key)
