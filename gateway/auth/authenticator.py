"""Who a bearer token stands for, whatever kind it is: static tokens by a dict lookup, tokens
verified before (a JWT, an introspection answer) from memory, and only a token not seen before
verified (:mod:`.jwts`, :mod:`.introspection`), the one step that may await.

The split keeps a request with a known token free of awaits (the pipeline's fast path):
:meth:`Authenticator.known` answers from memory or says it cannot; :meth:`Authenticator.verify`
then checks the token with the identity provider and remembers what it found.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from cachetools import LRUCache

from .caller import Caller
from .fetch import IdentityProviderError, SessionSource
from .introspection import Introspector
from .jwts import JwtVerifier, looks_like_jwt
from .resource import Resources
from .tokens import token_context
from .verdict import INVALID, MISSING, Verdict

if TYPE_CHECKING:
    from ..config import GatewayConfig

__all__ = ["MAX_REMEMBERED", "Authenticator"]

log = logging.getLogger("mcp_gateway.auth")

#: Verified tokens remembered at most (the least recently used go first).
MAX_REMEMBERED: Final = 10_000
#: RFC 6750, 2.1 ``b64token``: any other bearer value is invalid without asking the IdP.
_B64TOKEN: Final = re.compile(rb"[A-Za-z0-9\-._~+/]+=*")


class Authenticator:
    """The callers of ``config``'s ``[auth]`` (see the module); ``session`` gives the gateway's
    client session for the identity provider, ``wall`` wall-clock seconds (token expiry).

    * :attr:`enabled`: ``[auth]`` is configured (else every caller is anonymous).
    * :attr:`verifies`: some tokens need the identity provider (``[auth.jwt]``/``[auth.introspection]``).
    * :attr:`resources`: the resource URIs and metadata URLs (:class:`~.resource.Resources`).
    """

    def __init__(
        self,
        config: GatewayConfig,
        session: SessionSource | None = None,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        auth = config.auth
        self.enabled = auth is not None
        self.verifies = auth is not None and auth.verifies
        self.resources = Resources(config)
        self.required_scopes = frozenset(() if auth is None else auth.required_scopes)
        self._wall = wall
        self._static: dict[bytes, Verdict] = {}
        self._remembered: LRUCache[bytes, Verdict] = LRUCache(MAX_REMEMBERED)
        #: Verifications under way, by token context: concurrent first requests share one.
        self._pending: dict[bytes, asyncio.Future[Verdict]] = {}
        self.jwt: JwtVerifier | None = None
        self.introspection: Introspector | None = None
        self._audiences: frozenset[str] = frozenset()
        if auth is None:
            return
        for token in auth.tokens:
            context = token_context(token.encode())
            self._static[context] = Verdict("ok", Caller("token", context=context))
        for static in auth.static:
            context = token_context(static.token.encode())
            caller = Caller("static", subject=static.subject, scopes=frozenset(static.scopes), context=context)
            self._static[context] = Verdict("ok", caller)
        if auth.jwt is not None:
            self.jwt = JwtVerifier(auth.jwt, session)
            self._audiences = self.jwt.audiences
        if auth.introspection is not None:
            self.introspection = Introspector(auth.introspection, session)

    def known(self, token: bytes | None) -> Verdict | None:
        """The verdict on ``token`` (from :func:`~.tokens.bearer_token`; ``None``: none presented)
        if it can be given without the identity provider: ``None`` when :meth:`verify` must ask."""
        if token is None:
            return MISSING
        context = token_context(token)
        verdict = self._static.get(context)
        if verdict is not None:
            return verdict
        verdict = self._remembered.get(context)
        if verdict is not None:
            if verdict.until > self._wall():
                return verdict
            self._remembered.pop(context, None)  # past its exp (or reuse limit): verified again
        return None if self.verifies else INVALID

    async def verify(self, token: bytes) -> Verdict:
        """Verify ``token``, which :meth:`known` did not know, and remember the verdict until its
        ``until``. A JWT-shaped token goes to ``[auth.jwt]``, any other to
        ``[auth.introspection]`` (and every token to it without ``[auth.jwt]``). Never raises:
        an introspection endpoint that fails is logged as a WARNING and the token refused
        (``invalid``, not remembered). Concurrent calls for one token share one verification."""
        context = token_context(token)
        pending = self._pending.get(context)
        if pending is None:
            pending = self._pending[context] = asyncio.ensure_future(self._verify(token, context))
            pending.add_done_callback(lambda _: self._pending.pop(context, None))
        # Shielded: a caller that goes away does not cancel the verification the others wait on.
        return await asyncio.shield(pending)

    async def _verify(self, token: bytes, context: bytes) -> Verdict:
        if _B64TOKEN.fullmatch(token) is None:
            return INVALID
        now = self._wall()
        if self.jwt is not None and (looks_like_jwt(token) or self.introspection is None):
            verdict = await self.jwt.verify(token, context)
        elif self.introspection is not None:
            try:
                verdict = await self.introspection.verify(token, context, now)
            except IdentityProviderError as exc:
                log.warning("token introspection failed, the caller is refused: %s", exc)
                return INVALID
        else:
            return INVALID
        if verdict.audiences is not None and verdict.audiences & self._audiences:
            verdict = Verdict(verdict.outcome, verdict.caller, None, verdict.until)
        if verdict.until > now and verdict.until != math.inf:
            self._remembered[context] = verdict
        return verdict

    def accepts_anywhere(self, verdict: Verdict) -> bool:
        """Whether ``verdict``'s token is for any of the gateway's resources (the registry
        routes: ``/v0.1/servers``, ``/registry/versions``)."""
        if verdict.caller is None:
            return False
        return verdict.audiences is None or bool(verdict.audiences & self.resources.all_uris)

    async def caller(self, token: bytes | None) -> Verdict:
        """:meth:`known`, else :meth:`verify`: the verdict on ``token``, awaiting only when needed."""
        verdict = self.known(token)
        if verdict is None:
            assert token is not None
            verdict = await self.verify(token)
        return verdict
