"""The bearer check shared by the MCP routes, the registry routes and the admin route."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.auth import StaticCallers, bearer_matches, bearer_token
from gateway.config import ConfigError, parse_config

TOKENS = (b"first-token-0123456789", b"second-token-0123456789")


@pytest.mark.parametrize("header", ["Bearer first-token-0123456789", "bearer second-token-0123456789"])
def test_any_configured_token_is_accepted_whatever_the_scheme_case(header: str) -> None:
    assert bearer_matches(header, TOKENS)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic first-token-0123456789",
        "Bearer first-token-012345678",
        "Bearer first-token-0123456789x",
        "first-token-0123456789",
    ],
)
def test_anything_else_is_refused(header: str | None) -> None:
    assert not bearer_matches(header, TOKENS)


def test_no_configured_tokens_accepts_nothing() -> None:
    assert not bearer_matches("Bearer ", ())


def test_a_static_token_stands_for_its_subject_and_scopes_and_a_plain_token_for_no_one() -> None:
    config = parse_config(
        {
            "auth": {
                "tokens": ["plain-token-0123456789"],
                "static": [{"token": "ci-token-0123456789", "subject": "ci", "scopes": ["mcp:read"]}],
            }
        }
    )
    callers = StaticCallers(config.auth)
    ci = callers.caller(bearer_token("Bearer ci-token-0123456789"))
    assert ci is not None and (ci.kind, ci.subject, ci.scopes) == ("static", "ci", frozenset({"mcp:read"}))
    assert ci.context == hashlib.sha256(b"ci-token-0123456789").digest()
    plain = callers.caller(bearer_token("bearer plain-token-0123456789"))
    assert plain is not None and (plain.kind, plain.subject, plain.scopes) == ("token", None, frozenset())
    for header in (None, "Basic ci-token-0123456789", "Bearer ci-token-012345678", "Bearer \udcff"):
        assert callers.caller(bearer_token(header)) is None


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({}, "accepts no caller"),
        ({"tokens": []}, "accepts no caller"),
        (
            {"tokens": ["same-token-0123456789"], "static": [{"token": "same-token-0123456789", "subject": "ci"}]},
            "given twice",
        ),
        ({"static": [{"token": "short", "subject": "ci"}]}, "at least 16"),
        ({"static": [{"token": "ci-token-0123456789", "subject": "ci", "scopes": ["two words"]}]}, "pattern"),
    ],
)
def test_an_auth_table_with_no_caller_or_a_token_twice_is_a_load_error(auth: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"auth": auth})
