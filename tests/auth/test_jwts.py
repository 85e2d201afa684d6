"""JWT access tokens: what the verifier accepts (a listed algorithm, a key of the set, exact iss,
exp/nbf within the leeway) and what it refuses, each without raising."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.auth.jwts import JwtVerifier
from gateway.config import JwtConfig

from ..support.idp import FixtureIdp

AUD = "https://mcp.example.com/servers/pub/mcp"


def verifier(idp: FixtureIdp, **overrides: Any) -> JwtVerifier:
    settings: dict[str, Any] = {"issuer": idp.issuer, "jwks_url": idp.jwks_url, "algorithms": ["RS256", "ES256"]}
    return JwtVerifier(JwtConfig(**(settings | overrides)))


async def check(v: JwtVerifier, token: str | bytes) -> Any:
    raw = token.encode() if isinstance(token, str) else token
    return await v.verify(raw, hashlib.sha256(raw).digest())


@pytest.mark.parametrize("key", ["rsa", "ec"])
async def test_a_token_signed_by_a_key_of_the_set_stands_for_its_subject_and_scopes(idp: FixtureIdp, key: str) -> None:
    token = idp.mint(aud=AUD, key=key, scope="mcp:read mcp:write", scp=["extra"])  # type: ignore[arg-type]
    verdict = await check(verifier(idp), token)
    assert verdict.outcome == "ok" and verdict.accepts(AUD) and not verdict.accepts(AUD.replace("pub", "other"))
    caller = verdict.caller
    assert (caller.kind, caller.subject) == ("jwt", "alice")
    assert caller.scopes == {"mcp:read", "mcp:write", "extra"}
    assert caller.context == hashlib.sha256(token.encode()).digest()
    assert caller.claims["aud"] == AUD and caller.expires_at == caller.claims["exp"]
    assert verdict.until == caller.expires_at + 30


async def test_a_configured_audience_makes_the_token_good_on_every_route(idp: FixtureIdp) -> None:
    verdict = await check(verifier(idp, audiences=["api://gateway"]), idp.mint(aud=["api://gateway", "other"]))
    assert verdict.outcome == "ok" and verdict.audiences is None


def _part(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).rstrip(b"=").decode()


def _forged(idp: FixtureIdp, header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    return ".".join((_part(json.dumps(header).encode()), _part(json.dumps(payload).encode()), _part(signature)))


def _bad_tokens(idp: FixtureIdp) -> dict[str, str | bytes]:
    now = int(time.time())
    claims = {"iss": idp.issuer, "sub": "alice", "aud": AUD, "exp": now + 300}
    public_pem = idp.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    good = idp.mint(aud=AUD)
    head, body, signature = good.split(".")
    return {
        "wrong iss": idp.mint(aud=AUD, iss=idp.issuer + "/"),
        "alg none": _forged(idp, {"alg": "none", "kid": idp.rsa_kid}, claims),
        # Algorithm confusion: HMAC with the public key as the secret.
        "HS256 with the public key": _forged(
            idp,
            {"alg": "HS256", "kid": idp.rsa_kid, "typ": "JWT"},
            claims,
            hmac.new(public_pem, b"x", "sha256").digest(),
        ),
        "unknown kid": idp.mint(aud=AUD, headers={"kid": "not-in-the-set"}),
        "20 KB": idp.mint(aud=AUD, padding="x" * 20_000),
        "not base64": "!!!.@@@.###",
        "not ascii": "é.é.é".encode(),
        "tampered signature": f"{head}.{body}.{signature[:-4]}{'AAAA' if signature[-4:] != 'AAAA' else 'BBBB'}",
        "tampered claims": f"{head}.{_part(json.dumps(claims | {'sub': 'mallory'}).encode())}.{signature}",
        "no aud": jwt.encode(
            {k: v for k, v in claims.items() if k != "aud"}, idp.rsa, "RS256", headers={"kid": idp.rsa_kid}
        ),
        "no exp": jwt.encode(
            {k: v for k, v in claims.items() if k != "exp"}, idp.rsa, "RS256", headers={"kid": idp.rsa_kid}
        ),
        "not yet valid": idp.mint(aud=AUD, nbf=now + 3600),
        "signed by another key": jwt.encode(
            claims,
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "RS256",
            headers={"kid": idp.rsa_kid},
        ),
        "EC key for an RS256 header": jwt.encode(claims, idp.rsa, "RS256", headers={"kid": idp.ec_kid}),
    }


BAD = [
    "wrong iss",
    "alg none",
    "HS256 with the public key",
    "unknown kid",
    "20 KB",
    "not base64",
    "not ascii",
    "tampered signature",
    "tampered claims",
    "no aud",
    "no exp",
    "not yet valid",
    "signed by another key",
    "EC key for an RS256 header",
]


@pytest.mark.parametrize("kind", BAD)
async def test_a_token_the_issuer_did_not_sign_for_us_is_invalid(idp: FixtureIdp, kind: str) -> None:
    verdict = await check(verifier(idp), _bad_tokens(idp)[kind])
    assert (verdict.outcome, verdict.caller) == ("invalid", None)


async def test_an_expired_token_is_expired_past_the_leeway_only(idp: FixtureIdp) -> None:
    v = verifier(idp, leeway_s=30)
    assert (await check(v, idp.mint(aud=AUD, expires_in_s=-10))).outcome == "ok"  # within the leeway
    assert (await check(v, idp.mint(aud=AUD, expires_in_s=-60))).outcome == "expired"


async def test_a_refused_algorithm_costs_no_key_set_fetch(idp: FixtureIdp) -> None:
    v = verifier(idp, algorithms=["ES256"])
    assert (await check(v, idp.mint(aud=AUD, headers={"kid": "unknown"}))).outcome == "invalid"  # RS256
    assert idp.jwks_fetches == 0
