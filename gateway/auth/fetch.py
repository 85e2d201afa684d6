"""Bounded HTTP requests to the identity provider (a JWKS, an introspection answer): the one
place the auth package touches the network, and where its failures become one exception."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import aiohttp
import orjson

__all__ = ["FETCH_TIMEOUT_S", "MAX_ANSWER_BYTES", "IdentityProviderError", "SessionSource", "fetch_json"]

#: The largest JWKS or introspection answer read, in bytes (a real key set is a few KiB).
MAX_ANSWER_BYTES: Final = 256 * 1024
#: The whole request to the identity provider, connection included, in seconds.
FETCH_TIMEOUT_S: Final = 5.0

#: The gateway's client session while the app runs (``None`` before: one is opened for the request).
SessionSource = Callable[[], aiohttp.ClientSession | None]


class IdentityProviderError(Exception):
    """The identity provider could not be asked, or answered something unusable (never the caller's fault)."""


@contextlib.asynccontextmanager
async def _session(source: SessionSource | None) -> AsyncIterator[aiohttp.ClientSession]:
    session = None if source is None else source()
    if session is not None:
        yield session
        return
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), trust_env=False) as own:
        yield own


async def fetch_json(
    source: SessionSource | None,
    method: str,
    url: str,
    *,
    data: Mapping[str, str] | None = None,
    authorization: str | None = None,
) -> dict[str, Any]:
    """The JSON object ``url`` answers with HTTP 200, read in at most :data:`FETCH_TIMEOUT_S`
    seconds and :data:`MAX_ANSWER_BYTES` bytes; redirects are not followed (a redirect could
    lead anywhere the IdP's host is told to).

    Raises:
        IdentityProviderError: unreachable, too slow, not 200, too large, or not a JSON object.
    """
    try:
        async with _session(source) as session:
            async with session.request(
                method,
                url,
                data=data,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S),
                headers={"Accept": "application/json", **({"Authorization": authorization} if authorization else {})},
            ) as response:
                if response.status != 200:
                    raise IdentityProviderError(f"{url} answered HTTP {response.status}")
                if (response.content_length or 0) > MAX_ANSWER_BYTES:
                    raise IdentityProviderError(f"{url} answered more than {MAX_ANSWER_BYTES} bytes")
                body = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise IdentityProviderError(f"{url} answered more than {MAX_ANSWER_BYTES} bytes")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise IdentityProviderError(f"{url}: {type(exc).__name__}: {exc}") from exc
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise IdentityProviderError(f"{url} answered something that is not JSON") from exc
    if not isinstance(value, dict):
        raise IdentityProviderError(f"{url} answered JSON that is not an object")
    return value
