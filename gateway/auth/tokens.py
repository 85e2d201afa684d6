"""Bearer-token checks for the gateway's own callers: plain ``[auth].tokens`` and
``[[auth.static]]`` tokens (docs/configuration.md), and the admin and metrics tokens."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .caller import Caller

if TYPE_CHECKING:
    from ..config import AuthConfig

__all__ = ["StaticCallers", "bearer_matches", "bearer_token", "token_context"]


def bearer_matches(authorization: str | None, tokens: Sequence[bytes]) -> bool:
    """Whether an ``Authorization`` header value (``Bearer <token>``, RFC 6750 §2.1) carries
    one of ``tokens``. Every token is compared, each in constant time (``hmac.compare_digest``),
    so the time taken does not tell which one came close. Never raises, whatever the bytes."""
    scheme, _, presented = (authorization or "").partition(" ")
    # surrogateescape: aiohttp hands bytes that are not UTF-8 over as lone surrogates; such a
    # value matches no token (tokens are text), and must not raise.
    candidate = presented.strip().encode("utf-8", "surrogateescape") if scheme.lower() == "bearer" else b""
    ok = False
    for token in tokens:  # no early exit
        ok |= hmac.compare_digest(candidate, token)
    return ok


def bearer_token(authorization: str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value (RFC 6750 §2.1) as bytes, or
    ``None`` for no header or another scheme. Never raises, whatever the bytes."""
    scheme, _, presented = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return presented.strip().encode("utf-8", "surrogateescape")


def token_context(token: bytes) -> bytes:
    """The authorization context of ``token``: its SHA-256 (32 bytes), what is kept in its place."""
    return hashlib.sha256(token).digest()


class StaticCallers:
    """The callers of ``[auth].tokens`` and ``[[auth.static]]``, found by a SHA-256 of the
    presented token: a dict lookup on a digest tells nothing of how close a guess came, and
    costs the same for one token or a thousand."""

    def __init__(self, config: AuthConfig | None) -> None:
        self._callers: dict[bytes, Caller] = {}
        if config is None:
            return
        for token in config.tokens:
            context = token_context(token.encode())
            self._callers[context] = Caller("token", context=context)
        for static in config.static:
            context = token_context(static.token.encode())
            self._callers[context] = Caller(
                "static", subject=static.subject, scopes=frozenset(static.scopes), context=context
            )

    def __bool__(self) -> bool:
        return bool(self._callers)

    def caller(self, token: bytes | None) -> Caller | None:
        """The caller ``token`` (from :func:`bearer_token`) stands for, or ``None``."""
        return None if token is None else self._callers.get(token_context(token))
