"""A reload that changes ``[auth]`` applies from the next request: static tokens give way to JWTs
of an identity provider, and a new issuer's tokens replace the old one's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from ..support.fleet import Upstream
from ..support.idp import FixtureIdp
from ..support.reloading import admin_reload, gateway, public, rewrite, tools_list

BASE = "https://mcp.example.com"
STATIC = "static-caller-token-0123456789"


def jwt_auth(idp: FixtureIdp) -> dict[str, Any]:
    return {
        "jwt": {"issuer": idp.issuer, "jwks_url": idp.jwks_url, "algorithms": ["RS256"]},
        "resource": {"public_base_url": BASE},
    }


async def test_a_reload_from_static_tokens_to_jwts_applies_from_the_next_request(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, _ = counted
    first, second = FixtureIdp(), FixtureIdp()
    await first.start()
    await second.start()
    try:
        config: dict[str, Any] = {"upstreams": {"a": public(up_a)}, "auth": {"tokens": [STATIC]}}
        async with gateway(tmp_path, config) as gw:
            static = {"Authorization": f"Bearer {STATIC}"}
            token = first.mint(aud=f"{BASE}/servers/a/mcp")
            assert (await tools_list(http, gw.url(0, "a"), headers=static)).status == 200
            assert (await tools_list(http, gw.url(0, "a"), headers={"Authorization": f"Bearer {token}"})).status == 401
            rewrite(gw, {**config, "auth": jwt_auth(first)})
            assert (await admin_reload(http, gw))[0] == 200
            assert (await tools_list(http, gw.url(0, "a"), headers=static)).status == 401
            reply = await tools_list(http, gw.url(0, "a"), headers={"Authorization": f"Bearer {token}"})
            assert reply.status == 200
            # Another issuer: the remembered token of the first is verified again, and refused.
            rewrite(gw, {**config, "auth": jwt_auth(second)})
            assert (await admin_reload(http, gw))[0] == 200
            assert (await tools_list(http, gw.url(0, "a"), headers={"Authorization": f"Bearer {token}"})).status == 401
            other = second.mint(aud=f"{BASE}/servers/a/mcp")
            assert (await tools_list(http, gw.url(0, "a"), headers={"Authorization": f"Bearer {other}"})).status == 200
    finally:
        await first.stop()
        await second.stop()
