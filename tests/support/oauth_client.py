"""The official MCP SDK client with its own OAuth client (``mcp.client.auth.OAuthClientProvider``),
its user played by the test over HTTP: no browser, no callback server.

    async with oauth_client(url, authserver, "ci") as session:
        await session.client.list_tools()
        session.flow.authorization_urls   # the authorization requests the SDK built
        session.flow.tokens               # what it stored (OAuthToken), once it has a token

The SDK does every step itself: it sends its request without a token, reads the 401's
``WWW-Authenticate: Bearer resource_metadata=...`` (RFC 9728 section 5.1), fetches the protected
resource metadata and the authorization server's metadata (RFC 8414), registers a client
(RFC 7591), builds an authorization request with PKCE (RFC 7636) and ``resource`` (RFC 8707), and
exchanges the code. Its redirect handler is where a browser would open: here
:meth:`~tests.support.authserver.AuthServer.authorize` logs ``account`` in and hands the code
back through the callback handler. Tokens and the registration live in memory, per session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx2
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from .authserver import REDIRECT_URI, AuthServer
from .wire import V


@dataclass
class Flow:
    """What the SDK's OAuth client did: its ``TokenStorage`` (in memory) and its redirects."""

    account: str
    authserver: AuthServer
    tokens: OAuthToken | None = None
    client_info: OAuthClientInformationFull | None = None
    authorization_urls: list[str] = field(default_factory=list)
    _codes: asyncio.Queue[AuthorizationCodeResult] = field(default_factory=asyncio.Queue)

    # -- TokenStorage ----------------------------------------------------------------------
    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info

    # -- the user's side -------------------------------------------------------------------
    async def redirect(self, authorization_url: str) -> None:
        self.authorization_urls.append(authorization_url)
        code = await self.authserver.authorize(authorization_url, self.account)
        self._codes.put_nowait(AuthorizationCodeResult(code=code.code, state=code.state, iss=code.iss))

    async def callback(self) -> AuthorizationCodeResult:
        return await asyncio.wait_for(self._codes.get(), 30)


@dataclass
class OAuthSession:
    client: Client
    flow: Flow
    http: httpx2.AsyncClient


@asynccontextmanager
async def oauth_client(url: str, authserver: AuthServer, account: str) -> AsyncIterator[OAuthSession]:
    """An entered ``mcp.Client`` (2026-07-28, client cache off) on ``url`` whose HTTP client
    authenticates with the SDK's OAuth client provider as ``account`` of ``authserver``."""
    flow = Flow(account, authserver)
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(redirect_uris=[AnyUrl(REDIRECT_URI)], client_name="gateway-e2e-tests"),
        storage=flow,
        redirect_handler=flow.redirect,
        callback_handler=flow.callback,
    )
    async with httpx2.AsyncClient(auth=provider, trust_env=False, timeout=30) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=V, cache=None) as client:
            yield OAuthSession(client, flow, http)
