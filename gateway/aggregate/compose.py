"""Composing the members' answers into one (no I/O): the items under their exposed names, the
cache hints of the whole, and ``server/discover``.

Hints (MCP 2026-07-28, server/utilities/caching, 'Cacheable Results'): the aggregate is fresh
for as long as its stalest part (``ttlMs`` the least time left among the parts) and ``"public"``
only when every part is. An answer with a member left out is given ``ttlMs`` 0: it must not
outlive the failure that made it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..cache import CacheEntry, CacheKey
from ..errors import InvalidParams
from ..protocol import MODERN_VERSIONS
from .names import Names, fingerprint, mint_cursor

__all__ = [
    "LIST_FIELDS",
    "ComposedEntry",
    "MemberList",
    "Part",
    "capabilities_union",
    "discover_result",
    "exposed_items",
    "hints",
    "page_of",
    "supported_versions",
]

#: The list methods and the field of their result that holds the items.
LIST_FIELDS: Final[Mapping[str, str]] = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}
#: The field of an item that is exposed under another name, per list method.
_ITEM_NAME: Final[Mapping[str, str]] = {
    "tools/list": "name",
    "prompts/list": "name",
    "resources/list": "uri",
    "resources/templates/list": "uriTemplate",
}
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
#: Extensions whose methods ``POST /mcp`` does not route (a task's id names no member).
_UNROUTED_EXTENSIONS: Final = frozenset({"io.modelcontextprotocol/tasks"})


@dataclass(frozen=True, slots=True)
class Part:
    """One member's answer to one request (a page of a list, or its ``server/discover``).

    ``result`` is the JSON-RPC result; ``ttl_ms`` its freshness left when read (milliseconds);
    ``public`` whether its ``cacheScope`` is ``"public"``; ``key`` and ``entry`` the cache entry it
    was read from or stored as (``None`` when it is not stored: private, no ``ttlMs``, ...);
    ``stale`` it is an expired entry answering for a member that failed (stale-if-error);
    ``fetched`` the member was asked for it by this request (not read from the cache); ``size``
    its size in bytes, as received or stored; ``at`` when it was read (clock seconds: ``ttl_ms``
    is what was left then); ``waited_s`` the seconds its lookup waited on the shared tier.
    """

    result: Mapping[str, Any]
    ttl_ms: int
    public: bool
    key: CacheKey | None = None
    entry: CacheEntry | None = None
    stale: bool = False
    fetched: bool = False
    size: int = 0
    at: float = 0.0
    waited_s: float = 0.0

    def ttl_left_ms(self, now: float) -> int:
        """Milliseconds of freshness left at ``now`` (clock seconds), floored at 0."""
        return max(0, math.floor(self.ttl_ms - (now - self.at) * 1000))


class MemberList:
    """What one member gave for one aggregate request: its ``parts`` (pages), whether they are all
    of it (``complete``; false: it failed, or its pages were cut short, or one is stale), why not
    (``problem``), and for a list its ``items`` under their exposed names with their JSON
    (``rendered``)."""

    __slots__ = ("complete", "items", "parts", "problem", "rendered")

    def __init__(self, parts: list[Part], complete: bool, problem: str | None = None) -> None:
        self.parts = parts
        self.complete = complete
        self.problem = problem  # why it was left out, or cut short
        self.items: list[Any] = []  # a list's items under their exposed names
        self.rendered = b"[]"  # ... and their JSON


def exposed_items(method: str, member: str, items: object, names: Names) -> list[Any]:
    """``member``'s list items under their exposed names (:class:`~gateway.aggregate.names.Names`),
    every other field as the member listed it. Items without a name (a non-empty string) are left
    out: they could not be called or read through ``/mcp``."""
    if not isinstance(items, list):
        return []
    field = _ITEM_NAME[method]
    expose = names.expose if field == "name" else names.expose_uri
    out = []
    for item in items:
        if isinstance(item, dict) and type(value := item.get(field)) is str and value:
            out.append({**item, field: expose(member, value)})
    return out


def hints(parts: Iterable[Part], complete: bool, now: float) -> tuple[int, str]:
    """``(ttlMs, cacheScope)`` at ``now`` (clock seconds) of an answer made of ``parts``: the least
    time any part has left then (composing takes time too); ``complete`` is false when a member
    was left out (then ``ttlMs`` is 0)."""
    ttl_ms = math.inf
    public = True
    for part in parts:
        ttl_ms = min(ttl_ms, part.ttl_left_ms(now))
        public = public and part.public
    if not complete or ttl_ms == math.inf:
        ttl_ms = 0
    return int(ttl_ms), "public" if public else "private"


def supported_versions(results: Sequence[Mapping[str, Any]], known: Iterable[str]) -> list[str]:
    """The versions every one of ``results`` (``server/discover`` results) lists, among ``known``."""
    common = set(known)
    for result in results:
        listed = result.get("supportedVersions")
        common &= {v for v in listed if type(v) is str} if isinstance(listed, list) else set()
    return sorted(common, reverse=True)


def capabilities_union(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The union of the members' ``ServerCapabilities``: a feature any member has, with
    ``listChanged`` if any member's has it. Not ``resources.subscribe`` (a listen stream on
    ``/mcp`` does not take ``resourceSubscriptions``), nor ``logging`` (no ``logging/setLevel``
    there), nor extensions whose methods ``/mcp`` cannot route."""
    union: dict[str, Any] = {}
    for result in results:
        caps = result.get("capabilities")
        if not isinstance(caps, dict):
            continue
        for feature in ("tools", "prompts", "resources"):
            if isinstance(got := caps.get(feature), dict):
                merged = union.setdefault(feature, {})
                if got.get("listChanged") is True:
                    merged["listChanged"] = True
        if isinstance(caps.get("completions"), dict):
            union["completions"] = {}
        for group in ("experimental", "extensions"):
            if isinstance(got := caps.get(group), dict):
                for name, settings in got.items():
                    if name not in _UNROUTED_EXTENSIONS:
                        union.setdefault(group, {}).setdefault(name, settings)
    return union


@dataclass(frozen=True, slots=True)
class ComposedEntry(CacheEntry):
    """A stored answer of ``POST /mcp``, with the member entries it was made of (``parts``: their
    keys and weak references). It answers only while each of them is still the one stored: a
    member entry that expired, was purged or was fetched again makes it stale at once, whatever
    told this process (a notification, a purge, another replica)."""

    parts: tuple[tuple[CacheKey, weakref.ReferenceType[CacheEntry]], ...] = ()

    def current(self, get: Callable[[CacheKey], CacheEntry | None]) -> bool:
        """Whether every part is still what ``get`` (the store's lookup) finds under its key."""
        for key, ref in self.parts:
            entry = ref()
            if entry is None or get(key) is not entry:
                return False
        return True

    @classmethod
    def of(cls, entry: CacheEntry, parts: Iterable[Part]) -> ComposedEntry:
        """``entry`` (the rendered answer) made of ``parts``, each stored (``part.entry`` set).
        Its size counts the part keys it holds too."""
        held = tuple((part.key, weakref.ref(part.entry)) for part in parts if part.key and part.entry)
        keys_size = sum(len(key.params) + len(key.method) + 64 for key, _ in held)
        return cls(
            entry.head,
            entry.tail,
            entry.stored_at,
            entry.expires_at,
            entry.ttl_ms,
            entry.size + keys_size,
            entry.keep_until,
            entry.refresh_at,
            held,
        )


def page_of(
    method: str,
    lists: Sequence[MemberList],
    page: int,
    list_fingerprint: bytes | None,
    page_size: int,
    request_id: object,
) -> dict[str, Any]:
    """Page ``page`` (``page_size`` items) of the members' items in ``lists``, with the cursor of
    the next page if there is one (:func:`~.names.mint_cursor`); ``list_fingerprint`` is the one in
    the caller's cursor (``None`` without one).

    Raises:
        InvalidParams: the cursor's list has changed since, or it names a page past the end.
    """
    field = LIST_FIELDS[method]
    items = [item for got in lists for item in got.items]
    current = fingerprint(b"\n".join(got.rendered for got in lists))
    pages = max(1, math.ceil(len(items) / page_size))
    if list_fingerprint is not None and (list_fingerprint != current or page >= pages):
        raise InvalidParams(
            "Invalid params: the list has changed since this cursor was given; list again from the start",
            request_id=request_id,
        )
    start = page * page_size
    result: dict[str, Any] = {field: items[start : start + page_size]}
    if page + 1 < pages:
        result["nextCursor"] = mint_cursor(page + 1, current)
    return result


def discover_result(
    members: Sequence[str], lists: Sequence[MemberList], separator: str, server_info: Mapping[str, Any]
) -> dict[str, Any]:
    """``server/discover`` of ``/mcp`` from the members' (``lists``, one page each): the versions
    every answering member speaks, the union of their capabilities, instructions naming them."""
    answered = [(name, got.parts[0].result) for name, got in zip(members, lists, strict=True) if got.parts]
    results = [result for _, result in answered]
    lines = [
        f"One MCP server made of {len(answered)} members: {', '.join(name for name, _ in answered)}. Tools and "
        f"prompts are named <member>{separator}<name>; resources mcp-gateway:<member>/<uri>."
    ]
    for name, result in answered:
        text = result.get("instructions")
        if isinstance(text, str) and text:
            lines.append(f"{name}: {text}")
    return {
        "supportedVersions": supported_versions(results, MODERN_VERSIONS),
        "capabilities": capabilities_union(results),
        "instructions": "\n\n".join(lines),
        "_meta": {SERVER_INFO_KEY: dict(server_info)},
    }
