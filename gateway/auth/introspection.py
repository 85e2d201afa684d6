"""Opaque access tokens checked at the authorization server's introspection endpoint (RFC 7662),
the gateway authenticated with ``client_secret_basic`` (RFC 6749, 2.3.1)."""

from __future__ import annotations

import base64
import math
from typing import TYPE_CHECKING
from urllib.parse import quote

from .caller import Caller
from .fetch import SessionSource, fetch_json
from .verdict import EXPIRED, Verdict, audiences_of, scopes_of

if TYPE_CHECKING:
    from ..config import IntrospectionConfig

__all__ = ["Introspector"]


class Introspector:
    """Asks ``config.url`` about tokens (``[auth.introspection]``)."""

    def __init__(self, config: IntrospectionConfig, session: SessionSource | None = None) -> None:
        self.config = config
        self._session = session
        # RFC 6749, 2.3.1: the id and secret are form-urlencoded before they are joined.
        pair = f"{quote(config.client_id, safe='')}:{quote(config.client_secret, safe='')}"
        self._authorization = "Basic " + base64.b64encode(pair.encode()).decode()
        #: Requests made (the tests count them).
        self.requests = 0

    async def verify(self, token: bytes, context: bytes, now: float) -> Verdict:
        """The verdict on ``token`` (``context``: its SHA-256; ``now``: wall-clock seconds), to be
        remembered until its ``until``: at most ``cache_s`` and never past the answer's ``exp``.

        Raises:
            IdentityProviderError: the endpoint is down, slow, or answered something that is not
                an introspection answer (the caller is refused, nothing is remembered).
        """
        self.requests += 1
        answer = await fetch_json(
            self._session,
            "POST",
            self.config.url,
            data={"token": token.decode("utf-8", "surrogateescape"), "token_type_hint": "access_token"},
            authorization=self._authorization,
        )
        until = now + self.config.cache_s
        exp = answer.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            exp = None
        if answer.get("active") is not True:  # RFC 7662, 2.2: the one required member
            return Verdict("invalid", until=until)
        if exp is not None and exp <= now:
            return EXPIRED
        aud = answer.get("aud")
        sub = answer.get("sub")
        caller = Caller(
            "introspection",
            subject=sub if isinstance(sub, str) else None,
            scopes=scopes_of(answer.get("scope")),
            claims=answer,
            context=context,
            expires_at=None if exp is None else float(exp),
        )
        return Verdict(
            "ok",
            caller,
            None if aud is None else audiences_of(aud),
            min(until, math.inf if exp is None else float(exp)),
        )
