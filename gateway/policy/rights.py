"""What a caller may see and use: the union of the rules it matches (DESIGN: a rule grants only
what it names; ``upstreams`` absent is every upstream, ``tools``/``prompts``/``resources``
absent are none). Globs match the upstream's own names and URIs, on every route."""

from __future__ import annotations

import hashlib
import re
from typing import Final, Literal

from .matching import CompiledRule

__all__ = ["KINDS", "MAX_MEMOIZED_UPSTREAMS", "Kind", "Rights"]

#: What a rule names: tools and prompts by name, resources by URI or URI template.
Kind = Literal["tools", "prompts", "resources"]
KINDS: Final[tuple[Kind, ...]] = ("tools", "prompts", "resources")
#: Upstream names whose answers one :class:`Rights` keeps (a path may name anything: past this,
#: the answer is worked out again each time).
MAX_MEMOIZED_UPSTREAMS: Final = 1024


class Rights:
    """The rights of the callers that match exactly the rules ``rules`` (in config order).

    ``key`` is the tuple of their indexes in the config: small, hashable, equal for every caller
    with the same rights under one config (filtered views are kept per key, by a proxy of that
    config: :class:`~.views.ListViews`). ``tag`` (32 bytes) names the rights across configs: a
    SHA-256 of ``policy_digest`` (the rules' own digest) and ``key``, for what outlives a reload
    (the composed answers of ``POST /mcp`` kept in the store).
    """

    __slots__ = ("_patterns", "_upstreams", "key", "rules", "tag")

    def __init__(self, rules: tuple[CompiledRule, ...], policy_digest: bytes = b"") -> None:
        self.rules = rules
        self.key: tuple[int, ...] = tuple(rule.index for rule in rules)
        self.tag = hashlib.sha256(policy_digest + repr(self.key).encode()).digest()
        self._upstreams: dict[str, bool] = {}
        self._patterns: dict[tuple[Kind, str], tuple[re.Pattern[str], ...]] = {}

    def __repr__(self) -> str:
        return f"Rights({[rule.name for rule in self.rules]})"

    def allows_upstream(self, upstream: str) -> bool:
        """Whether some rule allows ``upstream`` (else it is an unknown upstream to the caller)."""
        allowed = self._upstreams.get(upstream)
        if allowed is None:
            allowed = any(rule.allows_upstream(upstream) for rule in self.rules)
            if len(self._upstreams) < MAX_MEMOIZED_UPSTREAMS:
                self._upstreams[upstream] = allowed
        return allowed

    def patterns(self, kind: Kind, upstream: str) -> tuple[re.Pattern[str], ...]:
        """The patterns of ``kind`` of every rule that allows ``upstream``."""
        got = self._patterns.get((kind, upstream))
        if got is None:
            found = []
            for rule in self.rules:
                pattern: re.Pattern[str] | None = getattr(rule, kind)
                if pattern is not None and rule.allows_upstream(upstream):
                    found.append(pattern)
            got = tuple(found)
            if len(self._patterns) < MAX_MEMOIZED_UPSTREAMS * len(KINDS):
                self._patterns[(kind, upstream)] = got
        return got

    def allows(self, kind: Kind, upstream: str, name: str) -> bool:
        """Whether the caller may see and use the ``kind`` item ``name`` (a tool or prompt name,
        a resource URI or URI template) of ``upstream``."""
        return any(pattern.fullmatch(name) is not None for pattern in self.patterns(kind, upstream))
