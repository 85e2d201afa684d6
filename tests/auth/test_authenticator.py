"""Callers proving who they are with JWTs, through a real gateway in front of a real SDK
upstream: what is accepted, what is refused with which challenge and counted outcome, and what
a remembered token costs."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from typing import Any

import aiohttp
import jwt
import pytest
from multidict import CIMultiDict

from gateway.auth import Authenticator
from gateway.config import parse_config
from gateway.telemetry import ACCESS_LOGGER, AccessLogHandler

from ..support import StartGateway
from ..support.fleet import Upstream
from ..support.idp import FixtureIdp
from ..support.polling import wait_until
from ..support.wire import mcp_headers, rpc
from .oauth import BASE, WELL_KNOWN, auth_total, challenge, oauth_config, resource, tools_list
from .test_jwts import _bad_tokens


async def test_a_valid_jwt_lists_the_tools(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    for key in ("rsa", "ec"):
        answer = await tools_list(http, gw, idp.mint(aud=resource("pub"), key=key))  # type: ignore[arg-type]
        assert answer.status == 200, answer.body
        assert {t["name"] for t in answer.body["result"]["tools"]} >= {"add"}
    assert auth_total(gw, "ok") == 2


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        ("expired", "expired"),
        ("wrong iss", "invalid"),
        ("another route's aud", "invalid"),
        ("alg none", "invalid"),
        ("HS256 with the public key", "invalid"),
        ("unknown kid", "invalid"),
        ("not base64", "invalid"),
        ("tampered signature", "invalid"),
        ("tampered claims", "invalid"),
        ("signed by another key", "invalid"),
    ],
)
async def test_a_bad_token_is_a_401_with_the_routes_challenge_and_its_outcome(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    idp: FixtureIdp,
    kind: str,
    outcome: str,
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    tokens: dict[str, Any] = _bad_tokens(idp)
    tokens["expired"] = idp.mint(aud=resource("pub"), expires_in_s=-120)
    tokens["another route's aud"] = idp.mint(aud=resource("other"))
    answer = await tools_list(http, gw, tokens[kind], id_=7)
    assert answer.status == 401
    assert answer.headers["WWW-Authenticate"] == challenge("pub", invalid=True)
    assert answer.body["id"] == 7 and answer.body["error"]["code"] == -32600 and "result" not in answer.body
    assert auth_total(gw, outcome) == 1 and auth_total(gw, "ok") == 0


async def test_no_token_is_a_401_without_an_error_code(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    answer = await tools_list(http, gw, None)
    assert answer.status == 401 and answer.headers["WWW-Authenticate"] == challenge("pub", invalid=False)
    assert auth_total(gw, "missing") == 1


async def test_a_20_kb_token_is_never_accepted(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    answer = await tools_list(http, gw, idp.mint(aud=resource("pub"), padding="x" * 20_000))
    # aiohttp refuses a header line over 8190 bytes before the gateway sees the request; a
    # listener that allowed it would find the token over MAX_TOKEN_BYTES (tests/auth/test_jwts.py).
    assert answer.status in (400, 401), answer.body


async def test_a_remembered_token_is_not_verified_again_on_a_hit_and_its_audience_still_counts(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    idp: FixtureIdp,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decodes = 0
    decode = jwt.PyJWT.decode

    def counting(self: jwt.PyJWT, *args: Any, **kwargs: Any) -> Any:
        nonlocal decodes
        decodes += 1
        return decode(self, *args, **kwargs)

    monkeypatch.setattr(jwt.PyJWT, "decode", counting)
    gw = await start_gateway(oauth_config(idp, public_up.url))
    token = idp.mint(aud=resource("pub"))
    for i in range(20):
        answer = await tools_list(http, gw, token, id_=i)
        assert answer.status == 200
    assert "hit" in answer.headers["Cache-Status"]
    assert decodes == 1
    refused = await tools_list(http, gw, token, name="other")  # remembered, but not for this route
    assert refused.status == 401 and refused.headers["WWW-Authenticate"] == challenge("other", invalid=True)
    assert decodes == 1
    assert auth_total(gw, "ok") == 20 and auth_total(gw, "invalid") == 1


async def test_a_flood_of_unknown_kids_makes_a_bounded_number_of_jwks_fetches(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    assert (await tools_list(http, gw, idp.mint(aud=resource("pub")))).status == 200
    forged = [idp.mint(aud=resource("pub"), headers={"kid": f"forged-{i}"}) for i in range(100)]
    answers = await asyncio.gather(*(tools_list(http, gw, t, id_=i) for i, t in enumerate(forged)))
    assert {a.status for a in answers} == {401}
    assert idp.jwks_fetches == 1  # within jwks_min_refetch_s of the first fetch
    assert auth_total(gw, "invalid") == 100


async def test_the_idp_down_keeps_the_last_good_key_set_serving(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url, jwks_min_refetch_s=0))
    assert (await tools_list(http, gw, idp.mint(aud=resource("pub")))).status == 200
    await idp.stop()
    # A token not seen before, of a kid in the set: verified with the keys held.
    assert (await tools_list(http, gw, idp.mint(aud=resource("pub"), sub="bob"))).status == 200
    # An unknown kid asks the IdP again (refetch interval 0), which is down: refused, never a 500.
    answer = await tools_list(http, gw, idp.mint(aud=resource("pub"), headers={"kid": "new"}))
    assert answer.status == 401


async def test_lacking_a_required_scope_is_a_403_challenge_naming_the_scopes_and_the_metadata(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url, required_scopes=["mcp:read", "mcp:tools"]))
    answer = await tools_list(http, gw, idp.mint(aud=resource("pub"), scope="mcp:read"))
    assert answer.status == 403
    assert answer.headers["WWW-Authenticate"] == (
        f'Bearer error="insufficient_scope", scope="mcp:read mcp:tools", '
        f'resource_metadata="{WELL_KNOWN}/servers/pub/mcp"'
    )
    assert auth_total(gw, "insufficient_scope") == 1
    entra_shaped = idp.mint(aud=resource("pub"), scp=["mcp:read", "mcp:tools"])
    assert (await tools_list(http, gw, entra_shaped)).status == 200


async def test_required_scopes_apply_to_the_registry_routes_too(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url, required_scopes=["mcp:read"]))
    for path in ("/v0.1/servers", "/registry/versions"):
        lacking = {"Authorization": f"Bearer {idp.mint(aud=BASE, scope='mcp:admin')}"}
        async with http.get(gw.base_url + path, headers=lacking) as r:
            assert r.status == 403, path
            assert r.headers["WWW-Authenticate"] == (
                f'Bearer error="insufficient_scope", scope="mcp:read", resource_metadata="{WELL_KNOWN}"'
            )
        holding = {"Authorization": f"Bearer {idp.mint(aud=BASE, scope='mcp:read')}"}
        async with http.get(gw.base_url + path, headers=holding) as r:
            assert r.status == 200, path
    assert auth_total(gw, "insufficient_scope") == 2


async def test_two_authorization_headers_are_no_caller_whichever_comes_first(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    good, other = idp.mint(aud=resource("pub")), idp.mint(aud=resource("pub"), sub="someone-else")
    body = json.dumps(rpc("tools/list"))
    for first, second in ((good, other), (other, good)):
        headers = CIMultiDict(mcp_headers("tools/list"))
        headers.add("Authorization", f"Bearer {first}")
        headers.add("Authorization", f"Bearer {second}")
        async with http.post(gw.url("pub"), data=body, headers=headers) as r:
            assert r.status == 401 and 'error="invalid_token"' in r.headers["WWW-Authenticate"]
        async with http.get(gw.base_url + "/v0.1/servers", headers=headers) as r:
            assert r.status == 401


async def test_the_registry_routes_take_a_jwt_for_any_of_the_gateways_resources(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    for path in ("/v0.1/servers", "/registry/versions"):
        for aud, status in ((resource("other"), 200), (BASE, 200), ("https://elsewhere.example.com/mcp", 401)):
            headers = {"Authorization": f"Bearer {idp.mint(aud=aud)}"}
            async with http.get(gw.base_url + path, headers=headers) as r:
                assert r.status == status, (path, aud)
                if status == 401:
                    assert r.headers["WWW-Authenticate"] == (
                        f'Bearer realm="mcp-gateway", resource_metadata="{WELL_KNOWN}", error="invalid_token"'
                    )
        async with http.get(gw.base_url + path) as r:
            assert r.status == 401


async def test_a_remembered_token_is_verified_again_once_past_its_exp(idp: FixtureIdp) -> None:
    now = [1_000_000.0]
    config = parse_config(oauth_config(idp, "http://127.0.0.1:9/mcp", leeway_s=0))
    auth = Authenticator(config, wall=lambda: now[0])
    token = idp.mint(aud=resource("pub"), expires_in_s=60).encode()
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    now[0] = time.time()
    assert auth.known(token) is None
    verdict = await auth.verify(token)
    assert verdict.outcome == "ok" and auth.known(token) is verdict
    now[0] = exp + 1
    assert auth.known(token) is None  # forgotten: the next request verifies it again


async def test_the_access_log_names_the_subject_and_never_the_token(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    out = io.StringIO()
    logger = logging.getLogger(ACCESS_LOGGER)
    saved = (logger.handlers[:], logger.propagate, logger.level)
    logger.handlers[:] = [AccessLogHandler(out)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    alice, bob = idp.mint(aud=resource("pub")), idp.mint(aud=resource("pub"), sub="bob")
    try:
        for token in (alice, bob, alice, None):
            await tools_list(http, gw, token)
        await wait_until(lambda: out.getvalue().count("\n") == 4, what="4 access-log lines")
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x.get("subject"), x["status"]) for x in lines] == [
        ("alice", 200),
        ("bob", 200),
        ("alice", 200),
        (None, 401),
    ]
    assert alice not in out.getvalue() and bob not in out.getvalue()


async def test_a_cached_answer_is_never_served_to_an_expired_or_foreign_token(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway(oauth_config(idp, public_up.url))
    assert (await tools_list(http, gw, idp.mint(aud=resource("pub")))).status == 200
    assert "hit" in (await tools_list(http, gw, idp.mint(aud=resource("pub"), sub="bob"))).headers["Cache-Status"]
    for token in (idp.mint(aud=resource("pub"), expires_in_s=-120), idp.mint(aud=resource("pub"), iss="https://x")):
        answer = await tools_list(http, gw, token)
        assert answer.status == 401 and "result" not in answer.body
        assert "hit" not in answer.headers["Cache-Status"]


async def test_every_mcp_route_authenticates_for_its_own_resource(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, idp: FixtureIdp
) -> None:
    config = oauth_config(idp, public_up.url)
    config["aggregate"] = {"upstreams": ["pub"]}
    gw = await start_gateway(config)
    aggregate = await tools_list(http, gw, idp.mint(aud=f"{BASE}/mcp"), name="/mcp")
    assert aggregate.status == 200 and aggregate.body["result"]["tools"]
    refused = await tools_list(http, gw, idp.mint(aud=resource("pub")), name="/mcp")
    assert refused.status == 401
    assert refused.headers["WWW-Authenticate"] == (
        f'Bearer realm="mcp-gateway", resource_metadata="{WELL_KNOWN}/mcp", error="invalid_token"'
    )
    for method in ("GET", "DELETE"):  # the legacy streams, and /mcp's other methods
        for url, name in ((gw.url("pub"), "/servers/pub/mcp"), (gw.base_url + "/mcp", "/mcp")):
            async with http.request(method, url) as r:
                assert r.status == 401, (method, url)
                assert r.headers["WWW-Authenticate"] == (
                    f'Bearer realm="mcp-gateway", resource_metadata="{WELL_KNOWN}{name}"'
                )


async def test_a_listen_stream_ends_when_its_token_expires(
    start_gateway: StartGateway, http: aiohttp.ClientSession, changing_up: Upstream, idp: FixtureIdp
) -> None:
    gw = await start_gateway({**oauth_config(idp, changing_up.url), "aggregate": {}})
    body = json.dumps(rpc("subscriptions/listen", notifications={"toolsListChanged": True}))
    lasting = idp.mint(aud=resource("pub"))
    brief = [idp.mint(aud=resource("pub"), expires_in_s=2), idp.mint(aud=f"{BASE}/mcp", expires_in_s=2)]
    streams = []
    try:
        for token, url in ((lasting, gw.url("pub")), (brief[0], gw.url("pub")), (brief[1], gw.base_url + "/mcp")):
            headers = {**mcp_headers("subscriptions/listen"), "Authorization": f"Bearer {token}"}
            resp = await http.post(url, data=body, headers=headers)
            assert resp.status == 200
            streams.append(resp)
        started = time.monotonic()
        async with asyncio.timeout(15):
            for resp in streams[1:]:  # per upstream and on /mcp
                while await resp.content.readany():  # until the stream ends
                    pass
        assert 1 <= time.monotonic() - started < 10
        assert not streams[0].content.at_eof()  # the other caller's stream goes on
    finally:
        for resp in streams:
            resp.close()
