"""A caller's rights and what a denial answers (gateway/policy/engine.py, rights.py)."""

from __future__ import annotations

from typing import Any

from gateway.auth import Caller
from gateway.config import PolicyConfig
from gateway.errors import InsufficientScope, InvalidParams
from gateway.policy import MAX_MEMOIZED_CALLERS, Policy

RULES = [
    {"name": "read", "scopes": ["mcp:read"], "upstreams": ["weather", "notes*"], "tools": ["get_*"], "prompts": ["*"]},
    {"name": "notes", "claims": {"groups": ["notes"]}, "upstreams": ["notes"], "resources": ["notes://public/*"]},
    {"name": "admin", "scopes": ["mcp:read", "mcp:admin"], "tools": ["*"], "resources": ["*"]},
    {
        "name": "eng-only",
        "scopes": ["mcp:eng"],
        "claims": {"groups": ["eng"]},
        "upstreams": ["weather"],
        "tools": ["set_*"],
    },
]


def policy(rules: list[dict[str, Any]] = RULES) -> Policy:
    return Policy(PolicyConfig.model_validate({"rules": rules}))


def caller(*scopes: str, context: bytes = b"", **claims: Any) -> Caller:
    return Caller("jwt", scopes=frozenset(scopes), claims=claims, context=context)


def test_rights_are_the_union_of_the_matched_rules_with_a_key_of_their_indexes() -> None:
    rights = policy().rights(caller("mcp:read", groups=["notes"]))
    assert rights.key == (0, 1)
    assert rights.allows("tools", "weather", "get_forecast") and not rights.allows("tools", "weather", "set_alarm")
    assert rights.allows("resources", "notes", "notes://public/a") and not rights.allows("resources", "notes", "x://a")
    assert not rights.allows("resources", "notes-eu", "notes://public/a")  # rule "notes" is for "notes" only
    assert rights.allows("prompts", "notes-eu", "anything")
    assert rights.allows_upstream("notes-eu") and not rights.allows_upstream("billing")


def test_absent_kinds_allow_nothing_and_no_rule_matched_sees_no_upstream() -> None:
    rights = policy().rights(caller(groups=["notes"]))
    assert rights.key == (1,)
    assert rights.allows_upstream("notes") and not rights.allows("tools", "notes", "get_x")
    nobody = policy().rights(caller())
    assert nobody.key == () and not nobody.allows_upstream("weather")


def test_callers_with_the_same_rules_share_one_rights_and_a_context_is_remembered() -> None:
    engine = policy()
    one = engine.rights(caller("mcp:read", context=b"a" * 32))
    assert engine.rights(caller("mcp:read", "unrelated")) is one
    # The same context is the same token: its rights are not worked out again.
    assert engine.rights(caller(context=b"a" * 32)) is one
    for n in range(MAX_MEMOIZED_CALLERS + 1):
        engine.rights(caller(context=n.to_bytes(32, "big")))
    assert len(engine._by_context) <= MAX_MEMOIZED_CALLERS


def test_a_denial_that_more_scopes_would_lift_names_that_rules_whole_scope_set() -> None:
    engine = policy()
    reader = caller("mcp:read")
    err = engine.denial(reader, "tools", "weather", "set_alarm", 7)
    assert isinstance(err, InsufficientScope) and err.status == 403 and err.request_id == 7
    assert err.scopes == ("mcp:read", "mcp:admin")
    assert err.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="mcp:read mcp:admin"'


def test_a_rule_whose_claims_the_caller_lacks_is_no_way_out() -> None:
    engine = policy([r for r in RULES if r["name"] != "admin"])
    assert engine.scopes_for(caller("mcp:read", groups=["eng"]), "tools", "weather", "set_alarm") == ("mcp:eng",)
    assert engine.scopes_for(caller("mcp:read", groups=["ops"]), "tools", "weather", "set_alarm") is None


def test_a_denial_no_rule_would_lift_is_the_upstreams_unknown_name() -> None:
    engine = policy([r for r in RULES if r["name"] != "admin"])
    tool = engine.denial(caller("mcp:read"), "tools", "weather", "delete_all", 1)
    assert isinstance(tool, InvalidParams) and (tool.code, tool.status) == (-32602, 400)
    assert str(tool) == "Unknown tool: delete_all" and tool.data is None
    resource = engine.denial(
        caller("mcp:read"), "resources", "weather", "secret://x", 1, shown="mcp-gateway:weather/secret://x"
    )
    assert str(resource) == "Unknown resource: mcp-gateway:weather/secret://x"
    assert resource.data == {"uri": "mcp-gateway:weather/secret://x"}
    assert str(engine.denial(caller(), "prompts", "billing", "p", 1)) == "Unknown prompt: p"
    assert isinstance(engine.denial(caller(), "prompts", "weather", "p", 1), InsufficientScope)
