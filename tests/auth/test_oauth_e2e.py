"""OAuth end to end: a real authorization server (oidc-provider), the gateway as the resource server.

The authorization server is ``tests/support/oidc/provider.mjs`` (the ``authserver`` fixture):
dynamic client registration, PKCE, RFC 8707 resource indicators minting JWT access tokens whose
``aud`` is the resource, and an automated login that the test steers with ``login_hint``.

In front of the gateway, the official SDK's own OAuth client (``tests/support/oauth_client.py``)
does the whole flow from the gateway's 401; behind it, the real SDK upstream
``tests/servers/public_upstream.py``. The policy lets engineers (``groups: ["eng"]``) use
everything and ``mcp:read`` holders (ci) the read-only tools; ``add`` needs ``mcp:write``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import jwt
import pytest
from aiohttp.test_utils import TestServer
from mcp import MCPError
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.config import parse_config

from ..support import RunningGateway, mcp_headers, rpc
from ..support.authserver import RESOURCE_SCOPES, AuthServer, AuthServerError, run_authserver
from ..support.fleet import Upstream, fetch_counts, fetch_requests, free_port, reset_counts
from ..support.oauth_client import oauth_client

pytestmark = pytest.mark.timeout(60)

RESOURCE = "http://127.0.0.1:8080/servers/pub/mcp"
#: The tools of tests/servers/public_upstream.py, and those the policy's "read" rule allows.
ALL_TOOLS = ("add", "echo", "slow_progress", "confirm_action", "lookup")
READ_ONLY_TOOLS = ("echo", "lookup")


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


# -- the gateway as the resource server, the SDK's own OAuth client in front ---------------------


@dataclass(frozen=True)
class OAuthGateway:
    """The gateway in-process on a port chosen before its config (``public_base_url`` names it)."""

    gateway: RunningGateway
    upstream: Upstream

    def url(self, upstream: str = "pub") -> str:
        return self.gateway.url(upstream)

    def auth_total(self, outcome: str) -> float:
        value = self.gateway.registry.get_sample_value("mcp_gateway_auth_total", {"outcome": outcome})
        return value or 0.0


def oauth_config(base_url: str, authserver: AuthServer, upstream: Upstream) -> dict[str, Any]:
    return {
        "registry": {"enabled": False},  # the tests count upstream requests exactly
        "auth": {
            "jwt": {"issuer": authserver.issuer, "jwks_url": authserver.jwks_url, "algorithms": ["RS256"]},
            "resource": {"public_base_url": base_url, "scopes_supported": list(RESOURCE_SCOPES)},
        },
        "policy": {
            "rules": [
                # engineers: everything; anyone with mcp:read (ci too): the read-only tools;
                # add with mcp:write, which ci may not be granted
                {"name": "eng", "claims": {"groups": ["eng"]}, "tools": ["*"], "prompts": ["*"], "resources": ["*"]},
                {"name": "read", "scopes": ["mcp:read"], "tools": list(READ_ONLY_TOOLS)},
                {"name": "write", "scopes": ["mcp:write"], "tools": ["add"]},
            ]
        },
        "upstreams": {"pub": {"url": upstream.url}},
    }


@pytest.fixture
async def oauth_gw(authserver: AuthServer, public_up: Upstream) -> AsyncIterator[OAuthGateway]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    registry = CollectorRegistry()
    app = create_app(parse_config(oauth_config(base_url, authserver, public_up), env={}), metrics_registry=registry)
    server = TestServer(app, host="127.0.0.1", port=port)
    await server.start_server()
    await reset_counts(public_up)
    try:
        yield OAuthGateway(RunningGateway(server, app, registry), public_up)
    finally:
        await server.close()


def authorization_request(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


async def raw_call(
    http: aiohttp.ClientSession, url: str, token: str | None, method: str, **params: Any
) -> tuple[int, Any]:
    """One JSON-RPC request (with ``token``, if any), past the SDK client, which may refuse some
    calls itself: (HTTP status, the JSON-RPC message)."""
    name = params.get("name")
    headers = mcp_headers(method, name, **({} if token is None else {"Authorization": f"Bearer {token}"}))
    async with http.post(url, json=rpc(method, 7, **params), headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_the_sdk_client_starts_from_the_gateways_401_and_gets_a_token_for_the_route_as_engineer(
    authserver: AuthServer, oauth_gw: OAuthGateway
) -> None:
    url = oauth_gw.url()
    async with oauth_client(url, authserver, "engineer") as session:
        tools = await session.client.list_tools()
        added = await session.client.call_tool("add", {"a": 2, "b": 3})
        flow = session.flow

    assert sorted(t.name for t in tools.tools) == sorted(ALL_TOOLS)
    assert not added.is_error and added.structured_content == {"result": 5}
    # One authorization, asked for this route's resource URI with the scopes the metadata lists.
    assert len(flow.authorization_urls) == 1
    request = authorization_request(flow.authorization_urls[0])
    assert request["resource"] == url
    assert request["scope"] == "mcp:read mcp:write"
    assert request["code_challenge_method"] == "S256"
    assert flow.client_info is not None and flow.client_info.client_id  # it registered itself
    assert flow.tokens is not None
    claims = jwt.decode(flow.tokens.access_token, options={"verify_signature": False})
    assert (claims["aud"], claims["sub"], claims["iss"]) == (url, "engineer", authserver.issuer)
    # The flow began with the gateway's 401 for a request without a token.
    assert oauth_gw.auth_total("missing") >= 1
    assert oauth_gw.auth_total("ok") >= 2
    # The caller's token never reaches the upstream.
    received = await fetch_requests(oauth_gw.upstream)
    assert received and all(r.header("authorization") is None for r in received)


async def test_ci_sees_only_the_read_only_tools_and_a_denied_call_never_reaches_the_upstream(
    authserver: AuthServer, oauth_gw: OAuthGateway, http: aiohttp.ClientSession
) -> None:
    url = oauth_gw.url()
    async with oauth_client(url, authserver, "ci") as session:
        tools = await session.client.list_tools()
        echoed = await session.client.call_tool("echo", {"text": "hi"})
        with pytest.raises(MCPError) as refused:
            await session.client.call_tool("slow_progress", {"steps": 1, "delay_ms": 1})
        assert session.flow.tokens is not None
        token = session.flow.tokens.access_token

    assert jwt.decode(token, options={"verify_signature": False})["scope"] == "mcp:read"
    assert sorted(t.name for t in tools.tools) == sorted(READ_ONLY_TOOLS)
    assert not echoed.is_error
    assert refused.value.error.code == -32602
    # The same call sent past the SDK client: refused by the gateway as an unknown tool.
    status, answer = await raw_call(http, url, token, "tools/call", name="slow_progress", arguments={"steps": 1})
    assert answer["error"]["code"] == -32602, (status, answer)
    counts = await fetch_counts(oauth_gw.upstream)
    calls = [r.json()["params"]["name"] for r in await fetch_requests(oauth_gw.upstream) if r.method == "tools/call"]
    assert calls == ["echo"]
    assert counts.get("tools/call") == 1
    assert oauth_gw.auth_total("denied") >= 2


async def test_engineer_and_ci_list_from_one_shared_entry_with_one_upstream_request(
    authserver: AuthServer, oauth_gw: OAuthGateway, http: aiohttp.ClientSession
) -> None:
    url = oauth_gw.url()
    tokens = {account: await authserver.mint_token(account, resource=url) for account in ("engineer", "ci")}
    await reset_counts(oauth_gw.upstream)

    lists = {account: (await raw_call(http, url, token, "tools/list"))[1] for account, token in tokens.items()}
    again = (await raw_call(http, url, tokens["ci"], "tools/list"))[1]

    assert (await fetch_counts(oauth_gw.upstream)).get("tools/list") == 1
    assert sorted(t["name"] for t in lists["engineer"]["result"]["tools"]) == sorted(ALL_TOOLS)
    ci = lists["ci"]["result"]
    assert sorted(t["name"] for t in ci["tools"]) == sorted(READ_ONLY_TOOLS)
    assert again["result"]["tools"] == ci["tools"]
    # A filtered list is the caller's own: private, for the time the shared entry has left.
    assert ci["cacheScope"] == "private"
    assert 0 < ci["ttlMs"] <= 60_000
    # Each kept tool is the upstream's own value, unchanged.
    engineer_tools = {t["name"]: t for t in lists["engineer"]["result"]["tools"]}
    assert all(t == engineer_tools[t["name"]] for t in ci["tools"])


async def test_a_call_needing_a_scope_ci_lacks_makes_the_sdk_step_up_and_is_refused_when_not_granted(
    authserver: AuthServer, oauth_gw: OAuthGateway, http: aiohttp.ClientSession
) -> None:
    url = oauth_gw.url()
    async with oauth_client(url, authserver, "ci") as session:
        await session.client.list_tools()
        with pytest.raises(MCPError):
            await session.client.call_tool("add", {"a": 2, "b": 3})
        flow = session.flow
    assert flow.tokens is not None
    token = flow.tokens.access_token

    # The 403 named the scope the "write" rule needs; the SDK asked for it (SEP-2350 step-up) and
    # the authorization server granted ci mcp:read again.
    assert [authorization_request(u)["scope"] for u in flow.authorization_urls] == [
        "mcp:read mcp:write",
        "mcp:read mcp:write",
    ]
    assert jwt.decode(token, options={"verify_signature": False})["scope"] == "mcp:read"
    headers = mcp_headers("tools/call", "add", Authorization=f"Bearer {token}")
    body = rpc("tools/call", 8, name="add", arguments={"a": 2, "b": 3})
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 403
        challenge = resp.headers["WWW-Authenticate"]
    assert 'error="insufficient_scope"' in challenge
    assert 'scope="mcp:write"' in challenge
    assert f'resource_metadata="{oauth_gw.gateway.base_url}/.well-known/oauth-protected-resource/servers/pub/mcp"' in (
        challenge
    )
    assert (await fetch_counts(oauth_gw.upstream)).get("tools/call") is None
    # A policy's refusal counts as denied, 403 or not; insufficient_scope is [auth.jwt]'s required_scopes.
    assert oauth_gw.auth_total("denied") >= 2


async def test_a_request_a_policy_refuses_is_counted_once_as_denied_not_also_ok(
    authserver: AuthServer, oauth_gw: OAuthGateway, http: aiohttp.ClientSession
) -> None:
    url = oauth_gw.url()
    token = await authserver.mint_token("ci", resource=url)

    listed, _ = await raw_call(http, url, token, "tools/list")
    refused, _ = await raw_call(http, url, token, "tools/call", name="slow_progress", arguments={"steps": 1})
    stepped, _ = await raw_call(http, url, token, "tools/call", name="add", arguments={"a": 2, "b": 3})

    assert (listed, refused, stepped) == (200, 400, 403)
    # One outcome a request: the authentication's "ok" gives way to the policy's refusal.
    assert {o: oauth_gw.auth_total(o) for o in ("ok", "denied", "insufficient_scope")} == {
        "ok": 1,
        "denied": 2,
        "insufficient_scope": 0,
    }
