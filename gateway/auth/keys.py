"""The issuer's signing keys: its JSON Web Key Set (RFC 7517, 5), fetched with the gateway's own
client, kept while the identity provider is down, refetched for an unknown ``kid`` at most once
per ``jwks_min_refetch_s``, one fetch at a time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

import jwt

from .fetch import IdentityProviderError, SessionSource, fetch_json

__all__ = ["RETRY_WITHOUT_SET_S", "KeySet"]

log = logging.getLogger("mcp_gateway.auth")

#: How often the set is fetched again while none has been fetched yet (the IdP was down at the
#: first token), in seconds: every token is refused until then.
RETRY_WITHOUT_SET_S: Final = 1.0


class KeySet:
    """The JWKS at ``url`` (see the module). ``clock`` gives monotonic seconds.

    * :meth:`key` finds a key by ``kid`` (or the only key, for a token without one), fetching
      the set first if it has none yet or does not hold that ``kid`` and the last fetch was
      ``min_refetch_s`` or more ago (:data:`RETRY_WITHOUT_SET_S` while no set was ever
      fetched). Concurrent callers share one fetch.
    * A fetch that fails (down, slow, not JSON, no usable key, too large) keeps the last good
      set and is logged as a WARNING.
    * Symmetric (``kty: oct``) keys and keys for encryption (``use: enc``) are never used: a
      shared secret would let anyone who knows it mint tokens.
    """

    def __init__(
        self,
        url: str,
        min_refetch_s: float,
        session: SessionSource | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.min_refetch_s = min_refetch_s
        self._session = session
        self._clock = clock
        self._keys: jwt.PyJWKSet | None = None
        self._fetched_at: float | None = None
        self._fetching: asyncio.Task[None] | None = None
        #: Fetches started (the tests bound it), and fetches that failed.
        self.fetches = 0
        self.failures = 0

    def cached(self, kid: str | None) -> jwt.PyJWK | None:
        """The key for ``kid`` in the set held now, without fetching (``None``: not there)."""
        keys = self._keys
        if keys is None:
            return None
        if kid is None:
            return keys.keys[0] if len(keys.keys) == 1 else None
        for key in keys.keys:
            if key.key_id == kid:
                return key
        return None

    async def key(self, kid: str | None) -> jwt.PyJWK | None:
        """The key for ``kid``, refetching the set when allowed (see the class); ``None``
        when no key of the set (old or new) has that ``kid``."""
        found = self.cached(kid)
        if found is not None:
            return found
        fetched_at = self._fetched_at
        # Until a first set is held, every token waits on it: retry sooner than for a new kid.
        interval = self.min_refetch_s if self._keys is not None else min(self.min_refetch_s, RETRY_WITHOUT_SET_S)
        if fetched_at is not None and self._clock() - fetched_at < interval and self._fetching is None:
            return None
        await self.refresh()
        return self.cached(kid)

    async def refresh(self) -> None:
        """Fetch the set now (or join the fetch under way). Never raises for the IdP's failures."""
        if self._fetching is None:
            self._fetched_at = self._clock()
            self.fetches += 1
            self._fetching = asyncio.ensure_future(self._fetch())
        task = self._fetching
        # Shielded: a caller that goes away does not cancel the fetch the others wait on.
        await asyncio.shield(task)

    async def _fetch(self) -> None:
        try:
            document = await fetch_json(self._session, "GET", self.url)
            keys = document.get("keys")
            if not isinstance(keys, list):
                raise IdentityProviderError(f"{self.url} answered no 'keys' list")
            usable = [k for k in keys if isinstance(k, dict) and k.get("kty") != "oct" and k.get("use", "sig") == "sig"]
            try:
                self._keys = jwt.PyJWKSet(usable)
            except jwt.PyJWTError as exc:
                raise IdentityProviderError(f"{self.url}: {exc}") from exc
        except IdentityProviderError as exc:
            self.failures += 1
            held = "keeping the last good key set" if self._keys is not None else "no key set yet"
            log.warning("JWKS fetch failed (%s): %s", held, exc)
        finally:
            self._fetching = None
