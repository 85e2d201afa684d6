"""The issuer's key set: fetched with bounds, kept while the identity provider fails, refetched
for an unknown kid at most once per jwks_min_refetch_s, one fetch for concurrent callers."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.auth.keys import RETRY_WITHOUT_SET_S, KeySet

from ..support.clock import FakeClock
from ..support.idp import FixtureIdp


async def test_a_flood_of_unknown_kids_makes_one_fetch_per_refetch_interval(idp: FixtureIdp) -> None:
    clock = FakeClock()
    keys = KeySet(idp.jwks_url, 30.0, clock=clock)
    assert await keys.key(idp.rsa_kid) is not None
    assert idp.jwks_fetches == 1
    found = await asyncio.gather(*(keys.key(f"forged-{i}") for i in range(200)))
    assert found == [None] * 200
    assert idp.jwks_fetches == 1  # within 30 s of the last fetch: no refetch at all
    clock.advance(31)
    assert await asyncio.gather(*(keys.key(f"forged-again-{i}") for i in range(200))) == [None] * 200
    assert idp.jwks_fetches == 2  # one refetch, shared by the 200


async def test_concurrent_first_callers_share_one_fetch(idp: FixtureIdp) -> None:
    keys = KeySet(idp.jwks_url, 30.0)
    found = await asyncio.gather(*(keys.key(idp.ec_kid) for _ in range(50)))
    assert all(k is not None and k.key_id == idp.ec_kid for k in found)
    assert idp.jwks_fetches == 1


async def test_a_rotated_key_is_found_by_one_refetch(idp: FixtureIdp) -> None:
    clock = FakeClock()
    keys = KeySet(idp.jwks_url, 30.0, clock=clock)
    assert await keys.key(idp.rsa_kid) is not None
    idp.rotate()
    assert await keys.key(idp.rsa_kid) is None  # too soon after the last fetch
    clock.advance(30)
    key = await keys.key(idp.rsa_kid)
    assert key is not None and key.key_id == idp.rsa_kid
    assert idp.jwks_fetches == 2


@pytest.mark.parametrize("mode", ["html", "huge", "slow", "empty", "down"])
async def test_the_last_good_set_keeps_serving_while_the_idp_fails(
    idp: FixtureIdp, short_fetches: float, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    clock = FakeClock()
    keys = KeySet(idp.jwks_url, 30.0, clock=clock)
    assert await keys.key(idp.rsa_kid) is not None
    if mode == "down":
        await idp.stop()
    else:
        idp.jwks_mode = mode  # type: ignore[assignment]
    clock.advance(31)
    with caplog.at_level(logging.WARNING, logger="mcp_gateway.auth"):
        assert await keys.key("unknown-kid") is None  # the refetch fails
    assert keys.failures == 1
    assert "JWKS fetch failed (keeping the last good key set)" in caplog.text
    key = await keys.key(idp.rsa_kid)
    assert key is not None and key.key_id == idp.rsa_kid


async def test_symmetric_keys_in_the_set_are_never_used(idp: FixtureIdp, monkeypatch: pytest.MonkeyPatch) -> None:
    served = idp.jwks()
    served["keys"].append({"kty": "oct", "k": "c2VjcmV0", "kid": "shared", "alg": "HS256"})
    monkeypatch.setattr(idp, "jwks", lambda: served)
    keys = KeySet(idp.jwks_url, 30.0)
    assert await keys.key(idp.rsa_kid) is not None
    assert keys.cached("shared") is None


async def test_an_idp_that_failed_the_first_fetch_is_asked_again_soon_not_after_the_refetch_interval(
    idp: FixtureIdp, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    keys = KeySet(idp.jwks_url, 30.0, clock=clock)
    idp.jwks_mode = "html"
    with caplog.at_level(logging.WARNING, logger="mcp_gateway.auth"):
        assert await keys.key(idp.rsa_kid) is None  # no key set yet
    assert "no key set yet" in caplog.text
    idp.jwks_mode = "ok"
    assert await keys.key(idp.rsa_kid) is None and keys.fetches == 1  # at most one fetch a second
    clock.advance(RETRY_WITHOUT_SET_S)
    assert await keys.key(idp.rsa_kid) is not None and keys.fetches == 2  # not 30 s later
