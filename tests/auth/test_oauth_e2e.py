"""OAuth end to end: a real authorization server (oidc-provider), the gateway as the resource server.

The authorization server is ``tests/support/oidc/provider.mjs`` (the ``authserver`` fixture):
dynamic client registration, PKCE, RFC 8707 resource indicators minting JWT access tokens whose
``aud`` is the resource, and an automated login that the test steers with ``login_hint``.
"""

from __future__ import annotations

from collections.abc import Iterator

import jwt
import pytest

from ..support.authserver import AuthServer, AuthServerError, run_authserver

pytestmark = pytest.mark.timeout(60)

RESOURCE = "http://127.0.0.1:8080/servers/pub/mcp"


@pytest.fixture(scope="module")
def opaque_authserver() -> Iterator[AuthServer]:
    with run_authserver(token_format="opaque") as server:
        yield server


async def test_the_authorization_server_publishes_registration_pkce_and_no_offline_access(
    authserver: AuthServer,
) -> None:
    meta = await authserver.metadata()
    assert meta["issuer"] == authserver.issuer
    assert meta["jwks_uri"] == authserver.jwks_url
    assert meta["registration_endpoint"] == f"{authserver.issuer}/reg"
    assert meta["code_challenge_methods_supported"] == ["S256"]
    # The SDK's client asks for offline_access whenever the server lists it.
    assert "offline_access" not in meta.get("scopes_supported", [])


@pytest.mark.parametrize(
    ("account", "scope", "groups"),
    [("engineer", "mcp:read mcp:write", ["eng"]), ("ci", "mcp:read", ["ci"])],
)
async def test_a_minted_access_token_is_a_jwt_for_the_requested_resource_signed_by_its_jwks(
    authserver: AuthServer, account: str, scope: str, groups: list[str]
) -> None:
    token = await authserver.mint_token(account, resource=RESOURCE)

    keys = jwt.PyJWKSet.from_dict(await authserver.jwks())
    header = jwt.get_unverified_header(token)
    assert header["typ"] == "at+jwt"  # RFC 9068 section 2.1
    key = next(k for k in keys.keys if k.key_id == header["kid"])
    claims = jwt.decode(token, key, algorithms=["RS256"], audience=RESOURCE, issuer=authserver.issuer)
    assert claims["aud"] == RESOURCE
    assert claims["sub"] == account
    assert claims["scope"] == scope  # ci asked for both and was granted mcp:read only
    assert claims["groups"] == groups
    assert claims["exp"] > claims["iat"]


async def test_a_token_for_another_resource_does_not_verify_for_this_one(authserver: AuthServer) -> None:
    token = await authserver.mint_token("engineer", resource="http://127.0.0.1:8080/servers/other/mcp")
    keys = jwt.PyJWKSet.from_dict(await authserver.jwks())
    with pytest.raises(jwt.InvalidAudienceError):
        jwt.decode(token, keys.keys[0], algorithms=["RS256"], audience=RESOURCE, issuer=authserver.issuer)


async def test_an_unknown_account_is_refused_access(authserver: AuthServer) -> None:
    with pytest.raises(AuthServerError, match="access_denied"):
        await authserver.mint_token("mallory", resource=RESOURCE)


async def test_an_opaque_token_is_introspected_active_with_its_audience_and_claims(
    opaque_authserver: AuthServer,
) -> None:
    token = await opaque_authserver.mint_token("ci", resource=RESOURCE)
    assert token.count(".") == 0  # not a JWT

    answer = await opaque_authserver.introspect(token)
    assert answer["active"] is True
    assert answer["aud"] == RESOURCE
    assert answer["sub"] == "ci"
    assert answer["scope"] == "mcp:read"
    assert answer["groups"] == ["ci"]
    assert (await opaque_authserver.introspect("not-a-token")) == {"active": False}
