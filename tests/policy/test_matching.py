"""Which rules a caller matches (gateway/policy/matching.py): every scope held, and each claim's
dotted path holding one of the values, any element of a list claim."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.auth import Caller
from gateway.config import PolicyConfig
from gateway.policy import claim_values, compile_rule


def rule(**fields: Any) -> Any:
    return compile_rule(0, PolicyConfig.model_validate({"rules": [{"name": "r", **fields}]}).rules[0])


def jwt_caller(scopes: tuple[str, ...] = (), **claims: Any) -> Caller:
    return Caller("jwt", subject="alice", scopes=frozenset(scopes), claims=claims)


def test_a_rule_needs_every_one_of_its_scopes() -> None:
    both = rule(scopes=["mcp:read", "mcp:write"])
    assert both.matches(jwt_caller(("mcp:write", "mcp:read", "other")))
    assert not both.matches(jwt_caller(("mcp:read",)))
    assert rule().matches(Caller("token"))  # no scopes, no claims: any caller


def test_keycloak_realm_roles_match_through_the_dotted_path() -> None:
    keycloak = rule(claims={"realm_access": {"roles": ["mcp-user"]}})
    assert keycloak.matches(jwt_caller(realm_access={"roles": ["offline_access", "mcp-user"]}))
    assert not keycloak.matches(jwt_caller(realm_access={"roles": ["offline_access"]}))
    assert not keycloak.matches(jwt_caller(realm_access=["mcp-user"]))  # not an object on the way
    assert not keycloak.matches(jwt_caller())


def test_entra_roles_and_groups_match_any_element_and_every_claim_must_hold() -> None:
    entra = rule(claims={"roles": ["Tools.Read"], "groups": ["6e1b0d3c-0000-4000-8000-000000000001"]})
    caller = jwt_caller(roles=["Tools.Read", "Other"], groups=["6e1b0d3c-0000-4000-8000-000000000001"])
    assert entra.matches(caller)
    assert not entra.matches(jwt_caller(roles=["Tools.Read"], groups=["someone-else"]))
    assert not entra.matches(jwt_caller(roles="Other", groups=["6e1b0d3c-0000-4000-8000-000000000001"]))


def test_a_string_claim_matches_when_it_is_one_of_the_values() -> None:
    assert rule(claims={"azp": ["cli", "web"]}).matches(jwt_caller(azp="web"))
    assert not rule(claims={"azp": ["cli"]}).matches(jwt_caller(azp="cli2"))


def test_a_claim_named_with_dots_is_read_whole_before_the_path_is_walked() -> None:
    claims = {"https://example.com/roles": ["admin"], "resource_access": {"gateway": {"roles": ["ops"]}}}
    assert claim_values(claims, "https://example.com/roles") == ("admin",)
    assert claim_values(claims, "resource_access.gateway.roles") == ("ops",)
    assert claim_values(claims, "resource_access.other.roles") == ()


@pytest.mark.parametrize("value", [1, True, None, {"roles": "x"}, [1, 2]])
def test_claims_that_hold_no_strings_match_nothing(value: object) -> None:
    assert not rule(claims={"groups": ["1", "True", "x"]}).matches(jwt_caller(groups=value))


def test_upstream_globs_match_whole_names_and_absent_means_every_upstream() -> None:
    some = rule(upstreams=["notes*", "weather"])
    assert some.allows_upstream("weather") and some.allows_upstream("notes-eu")
    assert not some.allows_upstream("weather2") and not some.allows_upstream("my-notes")
    assert rule().allows_upstream("anything")
    assert not rule(upstreams=[]).allows_upstream("weather")
