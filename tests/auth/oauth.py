"""What the auth behaviour tests share: a gateway config for the fixture identity provider,
and one MCP request with a bearer token."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..support import RunningGateway, mcp_headers, rpc
from ..support.idp import CLIENT_ID, CLIENT_SECRET, FixtureIdp

#: How callers reach the gateway in these tests (never taken from Host).
BASE = "https://mcp.example.com"
WELL_KNOWN = f"{BASE}/.well-known/oauth-protected-resource"


def resource(name: str) -> str:
    return f"{BASE}/servers/{name}/mcp"


def oauth_config(idp: FixtureIdp, upstream_url: str, *, introspection: bool = False, **jwt: Any) -> dict[str, Any]:
    """Upstreams ``pub`` and ``other`` (both ``upstream_url``), JWTs of ``idp`` (``jwt`` overrides)."""
    auth: dict[str, Any] = {
        "jwt": {"issuer": idp.issuer, "jwks_url": idp.jwks_url, "algorithms": ["RS256", "ES256"], **jwt},
        "resource": {"public_base_url": BASE},
    }
    if introspection:
        auth["introspection"] = {"url": idp.introspection_url, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}
    return {"auth": auth, "upstreams": {"pub": {"url": upstream_url}, "other": {"url": upstream_url}}}


@dataclass
class Answer:
    status: int
    headers: Any
    body: Any


async def tools_list(
    http: aiohttp.ClientSession, gw: RunningGateway, token: str | None, name: str = "pub", id_: int = 1
) -> Answer:
    """``tools/list`` on upstream ``name``'s route (a name starting with ``/``: that path)."""
    headers = mcp_headers("tools/list")
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    url = gw.base_url + name if name.startswith("/") else gw.url(name)
    async with http.post(url, data=json.dumps(rpc("tools/list", id_=id_)), headers=headers) as r:
        raw = await r.read()
        return Answer(r.status, r.headers, json.loads(raw) if raw[:1] == b"{" else raw)


def auth_total(gw: RunningGateway, outcome: str) -> float:
    """``mcp_gateway_auth_total{outcome}`` as a scrape reads it now."""
    return gw.registry.get_sample_value("mcp_gateway_auth_total", {"outcome": outcome}) or 0.0


def challenge(name: str, *, invalid: bool) -> str:
    """The 401 challenge of route ``/servers/NAME/mcp``."""
    error = ', error="invalid_token"' if invalid else ""
    return f'Bearer realm="mcp-gateway", resource_metadata="{WELL_KNOWN}/servers/{name}/mcp"{error}'
