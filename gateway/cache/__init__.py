"""The result cache: keys, policy (what may be stored, what goes stale), the store, coalescing.

No aiohttp here. Modules, lower first: ``keys`` (what makes two requests one), ``policy`` (the
storability decision, entries, invalidation by notification), ``store`` (the interface and the
in-process store), ``stale`` (stale-if-error's backoff), ``coalesce`` (one upstream request per
cold key).
"""

from .coalesce import Coalescer
from .keys import CacheKey, canonical_json, make_key
from .policy import (
    REFRESH_FRACTION,
    REFRESH_MIN_S,
    STORED,
    CacheEntry,
    Invalidation,
    build_entry,
    invalidation,
    lifetimes,
    store_outcome,
    uri_of,
)
from .stale import Backoff, Failed, Stale
from .store import CacheStore, Clock, EvictionListener, MemoryStore, PurgeListener

__all__ = [
    "REFRESH_FRACTION",
    "REFRESH_MIN_S",
    "STORED",
    "Backoff",
    "CacheEntry",
    "CacheKey",
    "CacheStore",
    "Clock",
    "Coalescer",
    "EvictionListener",
    "Failed",
    "Invalidation",
    "MemoryStore",
    "PurgeListener",
    "Stale",
    "build_entry",
    "canonical_json",
    "invalidation",
    "lifetimes",
    "make_key",
    "store_outcome",
    "uri_of",
]
