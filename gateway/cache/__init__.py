"""The result cache: keys, policy (what may be stored, what goes stale), the store, coalescing.

No aiohttp here. Modules, lower first: ``keys`` (what makes two requests one), ``policy`` (the
storability decision, entries, invalidation by notification), ``store`` (the interface and the
in-process store), ``coalesce`` (one upstream request per cold key).
"""

from .coalesce import Coalescer
from .keys import CacheKey, canonical_json, make_key
from .policy import STORED, CacheEntry, Invalidation, build_entry, invalidation, store_outcome, uri_of
from .store import CacheStore, Clock, EvictionListener, MemoryStore

__all__ = [
    "STORED",
    "CacheEntry",
    "CacheKey",
    "CacheStore",
    "Clock",
    "Coalescer",
    "EvictionListener",
    "Invalidation",
    "MemoryStore",
    "build_entry",
    "canonical_json",
    "invalidation",
    "make_key",
    "store_outcome",
    "uri_of",
]
