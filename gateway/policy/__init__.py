"""Per-caller policy (``[[policy.rules]]``, docs/policy.md): which upstreams, tools, prompts and
resources a caller sees and may use.

Modules, lowest first: ``matching`` (which rules a caller matches: scopes, dotted claim paths),
``rights`` (what the matched rules allow, with a small hashable key), ``engine`` (the rules of
one config: a caller's rights, memoized per authorization context, and what a denial answers),
``views`` (a list entry filtered for one set of rights, computed once per entry and rights).
"""

from .engine import MAX_MEMOIZED_CALLERS, Policy, denied_error
from .matching import CompiledRule, claim_values, compile_rule
from .rights import KINDS, Kind, Rights
from .views import LIST_ITEMS, MAX_VIEWS_PER_ENTRY, ListViews, filter_result

__all__ = [
    "KINDS",
    "LIST_ITEMS",
    "MAX_MEMOIZED_CALLERS",
    "MAX_VIEWS_PER_ENTRY",
    "CompiledRule",
    "Kind",
    "ListViews",
    "Policy",
    "Rights",
    "claim_values",
    "compile_rule",
    "denied_error",
    "filter_result",
]
