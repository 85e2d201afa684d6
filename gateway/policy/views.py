"""Lists filtered per caller from the one shared public entry.

A list answer (``tools/list``, ``prompts/list``, ``resources/list``, ``resources/templates/list``)
is stored once, public, for every caller; a caller whose rights are limited gets the items it may
see, each the same JSON value as the upstream's, ``nextCursor`` kept, and ``cacheScope:
"private"`` (the answer is its own: MCP 2026-07-28, server/utilities/caching, 'Cache Scope
Field'), with the time the entry has left. The view of an entry is computed once per (entry,
rights key) and kept while the entry lives (:class:`ListViews`): a filtered hit is one lookup
more than a plain one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..cache import CacheEntry, derive_entry, entry_result
from .rights import Kind, Rights

__all__ = ["LIST_ITEMS", "MAX_VIEWS_PER_ENTRY", "ListViews", "filter_result"]

#: Per list method: the result's field of items, the item's field a rule's glob matches, its kind.
LIST_ITEMS: Final[Mapping[str, tuple[str, str, Kind]]] = {
    "tools/list": ("tools", "name", "tools"),
    "prompts/list": ("prompts", "name", "prompts"),
    "resources/list": ("resources", "uri", "resources"),
    "resources/templates/list": ("resourceTemplates", "uriTemplate", "resources"),
}
#: Views kept per entry (one per rights key asking); past this, views are computed per hit.
MAX_VIEWS_PER_ENTRY: Final = 64


def filter_result(
    result: Mapping[str, Any], method: str, allowed: Callable[[Kind, str], bool], *, own: Callable[[str], str | None]
) -> dict[str, Any]:
    """``result`` of a ``method`` list with only the items ``allowed(kind, name)`` lets through
    (``own`` maps the item's listed name to the upstream's own: the identity on an upstream's
    route, un-exposing on ``/mcp``; ``None`` drops the item) and ``cacheScope`` ``private``.
    Every other field, ``nextCursor`` included, is kept as it is."""
    field, name_field, kind = LIST_ITEMS[method]
    out = dict(result)
    items = result.get(field)
    if isinstance(items, list):
        kept = []
        for item in items:
            name = item.get(name_field) if isinstance(item, dict) else None
            if type(name) is str and (local := own(name)) is not None and allowed(kind, local):
                kept.append(item)
        out[field] = kept
    out["cacheScope"] = "private"
    return out


def _same(name: str) -> str:
    return name


class ListViews:
    """The filtered views of list entries, per entry (weakly: a view goes with its entry) and
    rights key."""

    def __init__(self) -> None:
        self._views: weakref.WeakKeyDictionary[CacheEntry, dict[tuple[int, ...], CacheEntry]] = (
            weakref.WeakKeyDictionary()
        )

    def view(self, entry: CacheEntry, method: str, upstream: str, rights: Rights) -> CacheEntry:
        """``entry`` (a ``method`` list of ``upstream``) as ``rights`` may see it; ``entry``
        itself for a method that is no list."""
        views = self._views.get(entry)
        if views is not None:
            got = views.get(rights.key)
            if got is not None:
                return got
        if method not in LIST_ITEMS:
            return entry
        result = filter_result(
            entry_result(entry), method, lambda kind, name: rights.allows(kind, upstream, name), own=_same
        )
        made = derive_entry(entry, result)
        if made is None:  # cannot happen for what was rendered once; never answer unfiltered
            made = derive_entry(entry, {**result, LIST_ITEMS[method][0]: []})
            assert made is not None
        if views is None:
            views = self._views[entry] = {}
        if len(views) < MAX_VIEWS_PER_ENTRY:
            views[rights.key] = made
        return made

    def __len__(self) -> int:
        return sum(len(views) for views in self._views.values())
