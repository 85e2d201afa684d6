"""``[[policy.rules]]`` and ``cache.private_per_identity`` in the config (gateway/config/policy.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config

UPSTREAMS = {"weather": {"url": "http://127.0.0.1:9001/mcp"}, "notes": {"url": "http://127.0.0.1:9002/mcp"}}


def config(*rules: dict[str, Any]) -> Any:
    return parse_config({"upstreams": UPSTREAMS, "policy": {"rules": list(rules)}})


def test_a_nested_claims_table_means_the_same_as_its_dotted_path() -> None:
    nested = config({"name": "kc", "claims": {"realm_access": {"roles": ["mcp-user"]}, "azp": "cli"}})
    dotted = config({"name": "kc", "claims": {"realm_access.roles": ["mcp-user"], "azp": ["cli"]}})
    assert nested.policy == dotted.policy
    assert dict(nested.policy.rules[0].claims) == {"realm_access.roles": ("mcp-user",), "azp": ("cli",)}


def test_a_rule_grants_every_upstream_and_nothing_else_by_default() -> None:
    rule = config({"name": "bare"}).policy.rules[0]
    assert (rule.scopes, rule.upstreams, rule.tools, rule.prompts, rule.resources) == ((), None, (), (), ())
    assert not parse_config({}).cache.private_per_identity
    assert parse_config({"cache": {"private_per_identity": True}}).cache.private_per_identity


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            [{"name": "r", "upstreams": ["wether"]}],
            r"policy: rules 'r': upstreams: no upstream named 'wether' \(did you mean 'weather'",
        ),
        ([{"name": "r"}, {"name": "r"}], "policy.rules: rule name 'r' is given twice"),
        ([{"name": "r", "claims": {"groups": 3}}], "'groups' must be a string or a non-empty list of strings"),
        ([{"name": "r", "claims": {"groups": ["eng", 1]}}], "'groups' must be a string or a non-empty list of strings"),
        ([{"name": "r", "claims": {"realm_access": {"roles": [True]}}}], "'realm_access.roles' must be"),
        ([{"name": "r", "claims": {"a.b": "x", "a": {"b": "y"}}}], "'a.b' is given twice"),
        ([{"name": "r", "tool": ["*"]}], r"policy\.rules\[0\]\.tool: unknown key \(did you mean `tools`\?\)"),
    ],
)
def test_a_bad_rule_is_a_load_error_naming_its_key(rules: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(*rules)


def test_an_upstreams_glob_need_not_match_a_configured_upstream() -> None:
    assert config({"name": "r", "upstreams": ["notes*", "later-?"]}).policy.rules[0].upstreams == ("notes*", "later-?")
