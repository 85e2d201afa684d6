"""Opaque tokens checked at the introspection endpoint (RFC 7662), through a real gateway: an
active answer lets the caller in and is reused within cache_s; an endpoint that is down, slow or
answers garbage refuses the caller with a 401 and a WARNING, never a 500 or an accepted token."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import pytest

from gateway.auth import Authenticator, bearer_token
from gateway.config import parse_config

from ..support import StartGateway
from ..support.fleet import Upstream
from ..support.idp import FixtureIdp
from .oauth import auth_total, challenge, oauth_config, resource, tools_list

OPAQUE = "opaque-token-0123456789"


async def test_an_active_opaque_token_lists_the_tools_and_its_answer_is_reused(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    idp.introspection[OPAQUE] = {"active": True, "sub": "svc", "scope": "mcp:read", "exp": int(time.time()) + 600}
    gw = await start_gateway(oauth_config(idp, public_up.url, introspection=True, required_scopes=["mcp:read"]))
    for i in range(5):
        assert (await tools_list(http, gw, OPAQUE, id_=i)).status == 200
    assert idp.introspections == 1
    assert auth_total(gw, "ok") == 5
    # A JWT-shaped token goes to JWT verification, never to the introspection endpoint.
    assert (await tools_list(http, gw, idp.mint(aud=resource("pub"), scope="mcp:read"))).status == 200
    assert idp.introspections == 1


async def test_concurrent_first_requests_with_one_token_make_one_introspection(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    idp.introspection[OPAQUE] = {"active": True, "sub": "svc"}
    gw = await start_gateway(oauth_config(idp, public_up.url, introspection=True))
    answers = await asyncio.gather(*(tools_list(http, gw, OPAQUE, id_=i) for i in range(20)))
    assert {a.status for a in answers} == {200}
    assert idp.introspections == 1


async def test_an_inactive_or_expired_answer_is_a_401(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    idp.introspection["expired-token-0123456789"] = {"active": True, "exp": int(time.time()) - 5}
    idp.introspection["other-route-token-0123"] = {"active": True, "aud": resource("other")}
    gw = await start_gateway(oauth_config(idp, public_up.url, introspection=True))
    for token, outcome in (
        ("unknown-token-0123456789", "invalid"),
        ("expired-token-0123456789", "expired"),
        ("other-route-token-0123", "invalid"),
    ):
        answer = await tools_list(http, gw, token)
        assert answer.status == 401 and answer.headers["WWW-Authenticate"] == challenge("pub", invalid=True)
        assert auth_total(gw, outcome) >= 1, token


@pytest.mark.parametrize("fault", ["down", "slow", "html", "huge"])
async def test_an_introspection_endpoint_that_fails_refuses_the_caller_with_a_warning(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    idp: FixtureIdp,
    short_fetches: float,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    idp.introspection[OPAQUE] = {"active": True, "sub": "svc"}
    gw = await start_gateway(oauth_config(idp, public_up.url, introspection=True))
    if fault == "down":
        await idp.stop()
    else:
        idp.introspection_mode = fault  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="mcp_gateway.auth"):
        answer = await tools_list(http, gw, OPAQUE)
    assert answer.status == 401 and answer.headers["WWW-Authenticate"] == challenge("pub", invalid=True)
    assert "token introspection failed, the caller is refused" in caplog.text
    assert OPAQUE not in caplog.text
    if fault != "down":
        idp.introspection_mode = "ok"
        assert (await tools_list(http, gw, OPAQUE)).status == 200  # the failure was not remembered


@pytest.mark.parametrize("header", ["Bearer \udcffopaque-token", "Bearer opaque,token;0123", 'Bearer a"b'])
async def test_a_bearer_value_that_is_no_b64token_is_invalid_without_asking_the_idp(
    idp: FixtureIdp, header: str
) -> None:
    auth = Authenticator(parse_config(oauth_config(idp, "http://127.0.0.1:9/mcp", introspection=True)))
    token = bearer_token(header)
    assert token is not None and auth.known(token) is None
    verdict = await auth.verify(token)
    assert (verdict.outcome, verdict.caller) == ("invalid", None)
    assert idp.introspections == 0
