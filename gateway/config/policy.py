"""``[[policy.rules]]``: which upstreams, tools, prompts and resources each caller sees and may use
(docs/policy.md). The rules are read by :mod:`gateway.policy`."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Annotated, Any

from pydantic import Field, field_validator

from .auth import AuthConfig
from .base import _Model, located_error

__all__ = [
    "GLOB_CHARACTERS",
    "PolicyConfig",
    "PolicyRule",
    "check_rule_callers",
    "check_rule_upstreams",
    "flatten_claims",
]

#: The characters that make an ``upstreams`` entry a glob (``fnmatch``); without any, it names
#: one upstream, which must exist.
GLOB_CHARACTERS = frozenset("*?[")

Glob = Annotated[str, Field(min_length=1)]


def flatten_claims(value: object, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """``claims`` as dotted paths to the values accepted there: ``{"realm_access": {"roles":
    ["a"]}}`` and ``{"realm_access.roles": ["a"]}`` both give ``{"realm_access.roles": ("a",)}``;
    a string is a list of one.

    Raises:
        ValueError: a value is not a string, a list of strings or a table of them, or a path is
            given twice.
    """
    if not isinstance(value, Mapping):
        raise ValueError("claims must be a table of claim paths")
    out: dict[str, tuple[str, ...]] = {}
    for name, accepted in value.items():
        if not isinstance(name, str) or not name or any(not part for part in name.split(".")):
            raise ValueError(f"claims: {prefix + str(name)!r} is not a dotted claim path")
        path = prefix + name
        if isinstance(accepted, Mapping):
            found = flatten_claims(accepted, path + ".")
        elif isinstance(accepted, str):
            found = {path: (accepted,)}
        elif isinstance(accepted, list | tuple) and accepted and all(isinstance(v, str) for v in accepted):
            found = {path: tuple(accepted)}
        else:
            raise ValueError(f"claims: {path!r} must be a string or a non-empty list of strings, not {accepted!r}")
        for got in found:
            if got in out:
                raise ValueError(f"claims: {got!r} is given twice")
        out.update(found)
    return out


class PolicyRule(_Model):
    """``[[policy.rules]]``: what a caller matching it may see and use. A rule grants only what it
    names."""

    name: str = Field(min_length=1, description="The rule's name (unique): logs and errors name it.")
    scopes: tuple[Annotated[str, Field(min_length=1, pattern=r"^[!#-\[\]-~]+$")], ...] = Field(
        (), description="The caller holds all of these scopes (empty: any caller)."
    )
    claims: Mapping[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Each claim (a dotted path, or a nested table) holds one of these values.",
    )
    upstreams: tuple[Glob, ...] | None = Field(None, description="Globs on upstream names (absent: every upstream).")
    tools: tuple[Glob, ...] = Field((), description="Globs on tool names ('*': all; absent: none).")
    prompts: tuple[Glob, ...] = Field((), description="Globs on prompt names ('*': all; absent: none).")
    resources: tuple[Glob, ...] = Field(
        (), description="Globs on resource URIs and URI templates ('*': all; absent: none)."
    )

    @field_validator("claims", mode="before")
    @classmethod
    def _claims(cls, value: Any) -> dict[str, tuple[str, ...]]:
        return flatten_claims(value)


class PolicyConfig(_Model):
    """``[policy]``: per-caller rules. Without rules every authenticated caller sees everything."""

    rules: tuple[PolicyRule, ...] = Field(
        (), description="Once any rule exists, a caller sees and may use only what some rule it matches allows."
    )

    @field_validator("rules")
    @classmethod
    def _unique_names(cls, value: tuple[PolicyRule, ...]) -> tuple[PolicyRule, ...]:
        seen: set[str] = set()
        for rule in value:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} is given twice")
            seen.add(rule.name)
        return value


def check_rule_upstreams(policy: PolicyConfig, upstreams: Collection[str]) -> None:
    """Every ``upstreams`` entry of a rule without glob characters names a configured upstream.

    Raises:
        ValueError: naming the rule and the upstream (with the closest configured name).
    """
    for rule in policy.rules:
        for name in rule.upstreams or ():
            if GLOB_CHARACTERS.isdisjoint(name) and name not in upstreams:
                close = difflib.get_close_matches(name, list(upstreams), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ValueError(
                    f"rules {rule.name!r}: upstreams: no upstream named {name!r} "
                    f"({hint}the upstreams are {', '.join(upstreams) or 'none'})"
                )


def check_rule_callers(policy: PolicyConfig, auth: AuthConfig | None) -> None:
    """Some caller ``auth`` admits can match each rule: ``claims`` only a caller of ``[auth.jwt]``
    or ``[auth.introspection]`` holds (plain and ``[[auth.static]]`` tokens hold none); ``scopes``
    such a caller, or an ``[[auth.static]]`` entry holding them all (without ``[auth]`` every
    caller is anonymous and holds none).

    Raises:
        pydantic_core.PydanticCustomError: naming the rule, at its ``claims`` or ``scopes``
            (:func:`gateway.config.base.located_error`).
    """
    verifies = auth is not None and auth.verifies
    for index, rule in enumerate(policy.rules):
        never = f"rule {rule.name!r} can never match: "
        if rule.claims and not verifies:
            raise located_error(
                never + "only callers of [auth.jwt] or [auth.introspection] hold claims (plain tokens and "
                "[[auth.static]] entries hold none); configure one of them or remove claims",
                "rules",
                index,
                "claims",
            )
        if not rule.scopes or verifies:
            continue
        if auth is None:
            raise located_error(
                never + "without [auth] every caller is anonymous and holds no scopes; add [auth] "
                "([[auth.static]] entries with scopes, [auth.jwt] or [auth.introspection]) or remove scopes",
                "rules",
                index,
                "scopes",
            )
        if not any(set(rule.scopes) <= set(entry.scopes) for entry in auth.static):
            raise located_error(
                never + f"no caller holds all of {', '.join(rule.scopes)} (plain tokens hold no scopes, no "
                "[[auth.static]] entry holds them all, and there is no [auth.jwt] or [auth.introspection])",
                "rules",
                index,
                "scopes",
            )
