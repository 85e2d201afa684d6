"""The result cache: keys, policy (what may be stored, what goes stale), the store, coalescing.

No aiohttp here. Modules, lower first: ``keys`` (what makes two requests one), ``policy`` (the
storability decision, entries, invalidation by notification), ``store`` (the interface and the
in-process store), ``stale`` (stale-if-error's backoff), ``coalesce`` (one upstream request per
cold key), ``readthrough`` (the one way from a miss to an answer: coalescing, the shared tier,
stale and backoff, the route's fetch, keeping the answer).
"""

from .coalesce import Coalescer
from .keys import CacheKey, canonical_json, make_key
from .policy import (
    REFRESH_FRACTION,
    REFRESH_MIN_S,
    STORED,
    CacheEntry,
    Invalidation,
    StoreOutcome,
    build_entry,
    derive_entry,
    entry_result,
    invalidation,
    lifetimes,
    store_outcome,
    uri_of,
)
from .readthrough import Answer, Cached, CacheLookup, Lead, ReadThrough, SharedTier
from .stale import Backoff, Failed, Stale
from .store import CacheStore, Clock, EvictionListener, MemoryStore, PurgeListener

__all__ = [
    "REFRESH_FRACTION",
    "REFRESH_MIN_S",
    "STORED",
    "Answer",
    "Backoff",
    "CacheEntry",
    "CacheKey",
    "CacheLookup",
    "CacheStore",
    "Cached",
    "Clock",
    "Coalescer",
    "EvictionListener",
    "Failed",
    "Invalidation",
    "Lead",
    "MemoryStore",
    "PurgeListener",
    "ReadThrough",
    "SharedTier",
    "Stale",
    "StoreOutcome",
    "build_entry",
    "canonical_json",
    "derive_entry",
    "entry_result",
    "invalidation",
    "lifetimes",
    "make_key",
    "store_outcome",
    "uri_of",
]
