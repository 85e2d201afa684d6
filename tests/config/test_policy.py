"""``[[policy.rules]]`` and ``cache.private_per_identity`` in the config (gateway/config/policy.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, load_config, parse_config

UPSTREAMS = {"weather": {"url": "http://127.0.0.1:9001/mcp"}, "notes": {"url": "http://127.0.0.1:9002/mcp"}}
#: An [auth] whose callers may hold scopes and claims: rules with either can match.
JWT_AUTH = {
    "jwt": {"issuer": "https://idp.example.com", "jwks_url": "https://idp.example.com/certs", "algorithms": ["RS256"]},
    "resource": {"public_base_url": "https://gw.example.com"},
}
STATIC = {"token": "s" * 16, "subject": "ci", "scopes": ["mcp:read"]}


def config(*rules: dict[str, Any], auth: dict[str, Any] | None = JWT_AUTH) -> Any:
    return parse_config({"upstreams": UPSTREAMS, "policy": {"rules": list(rules)}} | ({"auth": auth} if auth else {}))


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


NO_CLAIMS = (
    "policy.rules[1].claims: rule 'eng' can never match: only callers of [auth.jwt] or [auth.introspection] hold "
    "claims (plain tokens and [[auth.static]] entries hold none); configure one of them or remove claims"
)


@pytest.mark.parametrize(
    "auth",
    [None, {"tokens": ["t" * 16]}, {"static": [STATIC]}],
    ids=["no auth", "plain tokens", "static tokens"],
)
def test_a_rule_with_claims_and_no_identity_provider_is_a_load_error_naming_it(auth: dict[str, Any] | None) -> None:
    with pytest.raises(ConfigError) as info:
        config({"name": "open"}, {"name": "eng", "claims": {"groups": "eng"}}, auth=auth)
    assert str(info.value) == NO_CLAIMS


def test_a_rule_with_scopes_and_no_auth_is_a_load_error_naming_it() -> None:
    with pytest.raises(ConfigError) as info:
        config({"name": "open"}, {"name": "read", "scopes": ["mcp:read"]}, auth=None)
    assert str(info.value) == (
        "policy.rules[1].scopes: rule 'read' can never match: without [auth] every caller is anonymous and holds "
        "no scopes; add [auth] ([[auth.static]] entries with scopes, [auth.jwt] or [auth.introspection]) or "
        "remove scopes"
    )


def test_a_rule_with_scopes_no_static_entry_holds_is_a_load_error_naming_it() -> None:
    rule = {"name": "admin", "scopes": ["mcp:read", "mcp:admin"]}
    with pytest.raises(ConfigError) as info:
        config(
            rule, auth={"tokens": ["t" * 16], "static": [STATIC, STATIC | {"token": "u" * 16, "scopes": ["mcp:admin"]}]}
        )
    assert str(info.value) == (
        "policy.rules[0].scopes: rule 'admin' can never match: no caller holds all of mcp:read, mcp:admin (plain "
        "tokens hold no scopes, no [[auth.static]] entry holds them all, and there is no [auth.jwt] or "
        "[auth.introspection])"
    )
    held = config(rule, auth={"static": [STATIC | {"scopes": ["mcp:admin", "mcp:read", "other"]}]})
    assert held.policy.rules[0].scopes == ("mcp:read", "mcp:admin")
    assert config(rule).policy.rules[0].scopes == ("mcp:read", "mcp:admin")  # a JWT may hold them


def test_a_rule_that_can_never_match_is_named_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        '[upstreams.weather]\nurl = "http://127.0.0.1:9/mcp"\n[auth]\ntokens = ["${TOKEN}"]\n'
        '[[policy.rules]]\nname = "open"\n[[policy.rules]]\nname = "eng"\n[policy.rules.claims]\ngroups = ["eng"]\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={"TOKEN": "t" * 16})
    assert str(info.value) == f"{path}: line 9: {NO_CLAIMS}"
