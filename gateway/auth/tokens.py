"""Bearer-token checks for the gateway's own callers (docs/routes.md, and ``auth.tokens``
in docs/configuration.md)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

__all__ = ["bearer_matches"]


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
