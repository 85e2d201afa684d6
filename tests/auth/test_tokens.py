"""The bearer check shared by the MCP routes, the registry routes and the admin route."""

from __future__ import annotations

import pytest

from gateway.auth import bearer_matches

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
