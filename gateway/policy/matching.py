"""Which ``[[policy.rules]]`` a caller matches: it holds every scope the rule names, and each of
the rule's claims (a dotted path into the token's claims) holds one of the rule's values."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..auth import Caller
from ..config import PolicyRule

__all__ = ["CompiledRule", "claim_values", "compile_glob", "compile_rule"]


def compile_glob(globs: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern matching any of ``globs`` (``fnmatch`` syntax, case-sensitive, the whole
    string), or ``None`` for no globs (matches nothing)."""
    parts = [fnmatch.translate(glob) for glob in globs]
    return re.compile("|".join(parts)) if parts else None


def claim_values(claims: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """The string values at ``path`` in ``claims``: the claim itself if it is named so whole (an
    IdP may put dots in a claim's name), else the dotted path walked through nested objects
    (Keycloak's ``realm_access.roles``). A list gives its string elements; anything else, or
    nothing there, gives ``()``."""
    if path in claims:
        value: object = claims[path]
    else:
        value = claims
        for part in path.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return ()
            value = value[part]
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(v for v in value if isinstance(v, str))
    return ()


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready to match: ``index`` its place in the config (the rights key is made of them),
    ``upstreams`` a pattern (``None``: every upstream), one pattern per kind (``None``: none)."""

    index: int
    name: str
    scopes: frozenset[str]
    scope_list: tuple[str, ...]
    claims: tuple[tuple[str, frozenset[str]], ...]
    upstreams: re.Pattern[str] | None
    tools: re.Pattern[str] | None
    prompts: re.Pattern[str] | None
    resources: re.Pattern[str] | None

    def claims_match(self, caller: Caller) -> bool:
        """Whether each of the rule's claims holds one of its values for ``caller`` (any element
        of a list claim)."""
        claims = caller.claims
        for path, accepted in self.claims:
            if accepted.isdisjoint(claim_values(claims, path)):
                return False
        return True

    def matches(self, caller: Caller) -> bool:
        """Whether ``caller`` holds every scope of the rule and matches its claims."""
        return self.scopes <= caller.scopes and self.claims_match(caller)

    def allows_upstream(self, upstream: str) -> bool:
        return self.upstreams is None or self.upstreams.fullmatch(upstream) is not None


def compile_rule(index: int, rule: PolicyRule) -> CompiledRule:
    """``rule`` (the ``index``-th of the config) compiled."""
    return CompiledRule(
        index,
        rule.name,
        frozenset(rule.scopes),
        tuple(rule.scopes),
        tuple((path, frozenset(values)) for path, values in rule.claims.items()),
        None if rule.upstreams is None else compile_glob(rule.upstreams) or re.compile("(?!)"),
        compile_glob(rule.tools),
        compile_glob(rule.prompts),
        compile_glob(rule.resources),
    )
