"""JWT access tokens (RFC 9068) checked with PyJWT against the issuer's key set (:mod:`.keys`):
a listed asymmetric algorithm, a key of the set, exact ``iss``, ``exp`` and ``nbf`` within the
leeway. The audience (RFC 8707) is read here and checked per route (:class:`.verdict.Verdict`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import jwt

from .caller import Caller
from .keys import KeySet
from .verdict import EXPIRED, INVALID, Verdict, audiences_of, scopes_of

if TYPE_CHECKING:
    from ..config import JwtConfig
    from .fetch import SessionSource

__all__ = ["MAX_TOKEN_BYTES", "JwtVerifier", "looks_like_jwt"]

log = logging.getLogger("mcp_gateway.auth")

#: Longer tokens are invalid unread (an Entra token with many groups is some 4 KiB).
MAX_TOKEN_BYTES: Final = 16 * 1024


def looks_like_jwt(token: bytes) -> bool:
    """Whether ``token`` has a JWS compact serialization's shape (three dot-separated parts)."""
    return token.count(b".") == 2


class JwtVerifier:
    """Verifies JWTs for ``config`` (``[auth.jwt]``); keys from ``keys`` (a :class:`KeySet`
    of ``jwks_url`` by default)."""

    def __init__(self, config: JwtConfig, session: SessionSource | None = None, *, keys: KeySet | None = None) -> None:
        self.config = config
        self.keys = keys if keys is not None else KeySet(config.jwks_url, config.jwks_min_refetch_s, session)
        self.algorithms = frozenset(config.algorithms)
        self.audiences = frozenset(config.audiences)
        self._jwt = jwt.PyJWT()

    async def verify(self, token: bytes, context: bytes) -> Verdict:
        """The verdict on ``token`` (``context``: its SHA-256). Never raises: a token that is not
        a JWT, or one the issuer's keys do not verify, is ``invalid``; an expired one ``expired``."""
        if len(token) > MAX_TOKEN_BYTES:
            return INVALID
        try:
            text = token.decode("ascii")
            header = jwt.get_unverified_header(text)
        except (UnicodeDecodeError, jwt.PyJWTError):
            return INVALID
        alg, kid = header.get("alg"), header.get("kid")
        # Checked before any key is looked for: a token of a refused algorithm never costs a fetch.
        if alg not in self.algorithms or not (kid is None or isinstance(kid, str)):
            return INVALID
        key = await self.keys.key(kid)
        if key is None:
            log.debug("JWT with a kid not in the key set: refused")
            return INVALID
        config = self.config
        try:
            claims = self._jwt.decode(
                text,
                key.key,
                algorithms=[alg],
                issuer=config.issuer,
                leeway=config.leeway_s,
                # The audience is checked per route, on every request (the route called).
                options={"require": ["exp", "iss", "aud"], "verify_aud": False},
            )
        except jwt.ExpiredSignatureError:
            return EXPIRED
        except (jwt.PyJWTError, ValueError, TypeError):
            return INVALID
        audiences = audiences_of(claims.get("aud"))
        exp = claims.get("exp")
        if not audiences or isinstance(exp, bool) or not isinstance(exp, int | float):
            return INVALID
        scopes: frozenset[str] = frozenset()
        for claim in config.scope_claims:
            scopes |= scopes_of(claims.get(claim))
        sub = claims.get("sub")
        caller = Caller(
            "jwt",
            subject=sub if isinstance(sub, str) else None,
            scopes=scopes,
            claims=claims,
            context=context,
            expires_at=float(exp),
        )
        return Verdict(
            "ok",
            caller,
            None if audiences & self.audiences else audiences,
            float(exp) + config.leeway_s,
        )
