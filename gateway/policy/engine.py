"""The policy of one config: a caller's :class:`~.rights.Rights` (memoized per authorization
context, bounded) and what a denial answers (MCP 2026-07-28, basic/authorization, 'Scope
Challenge Handling'; an unknown name as the upstream answers it, server/tools and
server/resources, 'Error Handling')."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import orjson

from ..auth import Caller
from ..config import PolicyConfig
from ..errors import GatewayError, InsufficientScope, InvalidParams
from .matching import CompiledRule, compile_rule
from .rights import Kind, Rights

__all__ = ["MAX_MEMOIZED_CALLERS", "Policy", "denied_error"]

#: Authorization contexts (tokens) whose rights are remembered; past this the memo starts over
#: (a context's rights are worked out again, never wrong).
MAX_MEMOIZED_CALLERS: Final = 4096
#: What the SDK upstreams answer for a name they do not have (``tests/servers``).
_UNKNOWN: Final[dict[Kind, str]] = {
    "tools": "Unknown tool",
    "prompts": "Unknown prompt",
    "resources": "Unknown resource",
}


class Policy:
    """``[[policy.rules]]`` of one config, compiled. Build it only when there are rules: without
    any, nothing is filtered or denied and no step asks."""

    def __init__(self, config: PolicyConfig) -> None:
        self.rules: tuple[CompiledRule, ...] = tuple(compile_rule(i, rule) for i, rule in enumerate(config.rules))
        #: What these rules are (a reload may change what a rule index means): in every
        #: :attr:`Rights.tag`, so that nothing kept for one set of rules answers under another.
        self.digest = hashlib.sha256(orjson.dumps(config.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)).digest()
        self._by_key: dict[tuple[int, ...], Rights] = {}
        self._by_context: dict[bytes, Rights] = {}

    def rights(self, caller: Caller) -> Rights:
        """The rights of ``caller``: the union of the rules it matches. One :class:`Rights` per
        set of matched rules, and per authorization context (``caller.context``; the anonymous
        caller of a gateway without ``[auth]`` is one) the one it got."""
        context = caller.context
        # A token's context names its caller; without [auth] every caller is the anonymous one.
        remembered = bool(context) or caller.kind == "none"
        if remembered:
            got = self._by_context.get(context)
            if got is not None:
                return got
        matched = tuple(rule for rule in self.rules if rule.matches(caller))
        key = tuple(rule.index for rule in matched)
        rights = self._by_key.get(key)
        if rights is None:
            rights = self._by_key[key] = Rights(matched, self.digest)
        if remembered:
            if len(self._by_context) >= MAX_MEMOIZED_CALLERS:
                self._by_context.clear()
            self._by_context[context] = rights
        return rights

    def scopes_for(self, caller: Caller, kind: Kind, upstream: str, name: str) -> tuple[str, ...] | None:
        """For a denied ``kind`` ``name`` of ``upstream``: the full scope set of the first rule
        (in config order) that allows it and whose claims ``caller`` matches, lacking only
        scopes; ``None`` when no rule would allow it with more scopes."""
        for rule in self.rules:
            if rule.scopes <= caller.scopes or not rule.claims_match(caller):
                continue  # matched already (and did not allow it), or scopes would not help
            pattern = getattr(rule, kind)
            if pattern is not None and rule.allows_upstream(upstream) and pattern.fullmatch(name) is not None:
                return rule.scope_list
        return None

    def denial(
        self, caller: Caller, kind: Kind, upstream: str, name: str, request_id: object, *, shown: object = None
    ) -> GatewayError:
        """The error a denied ``kind`` ``name`` of ``upstream`` is answered with
        (:func:`denied_error`; ``shown``: the name as the caller sent it, ``name`` by default)."""
        scopes = self.scopes_for(caller, kind, upstream, name)
        return denied_error(kind, name if not isinstance(shown, str) else shown, scopes, request_id)


def denied_error(kind: Kind, name: str, scopes: Sequence[str] | None, request_id: object) -> GatewayError:
    """:class:`InsufficientScope` (HTTP 403) naming ``scopes``, or with ``None`` the upstream's
    own answer to a name it does not have: -32602 (HTTP 400) ``Unknown tool: NAME`` (``prompt``,
    ``resource``; a resource's ``data`` names its ``uri``)."""
    if scopes is not None:
        return InsufficientScope(scopes, request_id=request_id)
    return InvalidParams(
        f"{_UNKNOWN[kind]}: {name}", request_id=request_id, data={"uri": name} if kind == "resources" else None
    )
