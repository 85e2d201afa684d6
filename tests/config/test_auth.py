"""``[auth.jwt]``, ``[auth.introspection]`` and ``[auth.resource]``: their defaults, and the
load errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config

JWT = {
    "issuer": "https://idp.example.com/realms/mcp",
    "jwks_url": "https://idp.example.com/certs",
    "algorithms": ["RS256"],
}
BASE = {"public_base_url": "https://MCP.example.com/"}


def config(auth: dict[str, Any], **rest: Any) -> Any:
    return parse_config({"auth": auth, "upstreams": {"a": {"url": "http://127.0.0.1:9/mcp"}}, **rest})


def test_a_jwt_only_gateway_needs_no_static_tokens_and_has_the_documented_defaults() -> None:
    auth = config({"jwt": JWT, "resource": BASE}).auth
    jwt = auth.jwt
    assert auth.tokens == () and auth.static == ()
    assert (jwt.leeway_s, jwt.scope_claims, jwt.required_scopes, jwt.jwks_min_refetch_s) == (
        30,
        ("scope", "scp"),
        (),
        30,
    )
    assert jwt.audiences == ()
    assert auth.public_base(None) == "https://mcp.example.com"  # canonical: lowercase host, no trailing slash
    assert auth.authorization_servers() == (JWT["issuer"],)


def test_introspection_defaults_and_the_registry_base_url_as_fallback() -> None:
    introspection = {"url": "https://idp.example.com/introspect", "client_id": "gw", "client_secret": "s3cret"}
    auth = config(
        {"introspection": introspection, "resource": {"authorization_servers": ["https://idp.example.com"]}},
        registry={"public_base_url": "https://gw.example.com/"},
    ).auth
    assert auth.introspection.cache_s == 60
    assert auth.public_base("https://gw.example.com/") == "https://gw.example.com"


@pytest.mark.parametrize(
    ("auth", "rest", "message"),
    [
        ({"jwt": JWT | {"algorithms": ["none"]}, "resource": BASE}, {}, r"auth\.jwt\.algorithms: .*'none' is refused"),
        ({"jwt": JWT | {"algorithms": ["RS256", "HS256"]}, "resource": BASE}, {}, r"auth\.jwt\.algorithms: .*'HS256'"),
        ({"jwt": {k: v for k, v in JWT.items() if k != "algorithms"}, "resource": BASE}, {}, r"auth\.jwt\.algorithms"),
        ({"jwt": JWT | {"jwks_url": "http://idp.example.com/certs"}, "resource": BASE}, {}, r"jwks_url must use https"),
        (
            {"introspection": {"url": "http://10.0.0.1/i", "client_id": "gw", "client_secret": "s"}, "resource": BASE},
            {},
            r"auth\.introspection\.url: .*must use https",
        ),
        ({"jwt": JWT}, {}, r"public_base_url is required"),
        ({"jwt": JWT, "resource": BASE | {"scopes_supported": ["offline_access"]}}, {}, r"offline_access"),
        (
            {"introspection": {"url": "https://idp/i", "client_id": "gw", "client_secret": "s"}, "resource": BASE},
            {},
            r"authorization_servers is required",
        ),
        ({"jwt": JWT, "resource": {"public_base_url": "ftp://x"}}, {}, r"public_base_url must be an http"),
    ],
)
def test_a_bad_auth_table_is_a_load_error_naming_the_key(
    auth: dict[str, Any], rest: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config(auth, **rest)


def test_jwt_with_a_forwarded_authorization_is_a_load_error() -> None:
    with pytest.raises(ConfigError, match=r"forward_authorization cannot be used with \[auth\]"):
        parse_config(
            {
                "auth": {"jwt": JWT, "resource": BASE},
                "upstreams": {"a": {"url": "http://127.0.0.1:9/mcp", "forward_authorization": True}},
            }
        )


def test_plain_http_to_loopback_is_allowed_for_the_identity_provider() -> None:
    for host in ("127.0.0.1:8443", "localhost", "[::1]"):
        jwt = JWT | {"jwks_url": f"http://{host}/certs"}
        assert config({"jwt": jwt, "resource": BASE}).auth.jwt.jwks_url == f"http://{host}/certs"
