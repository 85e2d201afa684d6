"""A real OAuth 2.1 authorization server for the tests: panva's ``oidc-provider`` on 127.0.0.1.

``tests/support/oidc/provider.mjs`` runs it (its header says what it is configured with); node 22
and the pinned package are installed into ``.tools/`` by ``scripts/install-tools.sh``.

    async with run_authserver() as idp:                  # or: with run_authserver() as idp
        idp.issuer       # "http://127.0.0.1:PORT" (compared exactly with a token's "iss")
        idp.jwks_url     # "http://127.0.0.1:PORT/jwks"
        token = await idp.mint_token("ci", resource="http://127.0.0.1:GW/servers/pub/mcp")
        code = await idp.authorize(authorization_url, "engineer")   # an SDK client's redirect

Accounts (:data:`ACCOUNTS`): ``engineer`` may be granted ``mcp:read mcp:write`` and carries
``groups: ["eng"]``; ``ci`` only ``mcp:read``, ``groups: ["ci"]``. The account is chosen by the
authorization request's ``login_hint``; the provider's automated interaction logs it in and
grants its own scopes among those requested (RFC 6749 section 3.3 lets it grant fewer).

Access tokens are JWTs (RS256, ``typ: at+jwt``) whose ``aud`` is the ``resource`` asked for
(RFC 8707 section 2), or opaque tokens for RFC 7662 introspection with ``token_format="opaque"``
(introspected by the pre-registered confidential client :data:`INTROSPECTION_CLIENT_ID`).
The process is stopped (terminated, then killed) and reaped on exit; its stdout and stderr go to
a temporary log, named in the error when it does not start (:meth:`AuthServer.log`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import subprocess
import tempfile
import time
import urllib.error
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit, urlunsplit

import httpx2

from .conformance import NODE, TOOLS_DIR
from .fleet import DIRECT, HOST, REPO_ROOT, free_port

SCRIPT = REPO_ROOT / "tests" / "support" / "oidc" / "provider.mjs"
PACKAGE_DIR = TOOLS_DIR / "node_modules" / "oidc-provider"
PACKAGE_VERSION = "9.13.3"  # scripts/install-tools.sh pins the same
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
#: The authorization interaction follows at most this many redirects on the provider.
MAX_REDIRECTS = 10

#: Scopes the provider's resource servers define, and what each account may be granted.
RESOURCE_SCOPES = ("mcp:read", "mcp:write")
ACCOUNTS: Mapping[str, tuple[str, ...]] = {"engineer": ("mcp:read", "mcp:write"), "ci": ("mcp:read",)}
GROUPS: Mapping[str, tuple[str, ...]] = {"engineer": ("eng",), "ci": ("ci",)}
INTROSPECTION_CLIENT_ID = "mcp-gateway"
INTROSPECTION_CLIENT_SECRET = "mcp-gateway-introspection-secret"
#: The redirect URI of the clients :meth:`AuthServer.mint_token` registers. Nothing listens
#: there: the redirect to it is read from the provider's Location header, never followed.
REDIRECT_URI = "http://127.0.0.1:1/callback"


class AuthServerError(RuntimeError):
    """The provider did not start, or a step of the authorization flow was refused."""


def tools_available() -> bool:
    """True when node 22 and the pinned ``oidc-provider`` are installed in ``.tools/``."""
    try:
        manifest = json.loads((PACKAGE_DIR / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return NODE.is_file() and os.access(NODE, os.X_OK) and manifest.get("version") == PACKAGE_VERSION


@dataclass(frozen=True)
class AuthorizationCode:
    """The authorization response's query (RFC 6749 section 4.1.2; ``iss``: RFC 9207)."""

    code: str
    state: str | None
    iss: str | None


@dataclass
class AuthServer:
    """A running ``provider.mjs``."""

    port: int
    process: subprocess.Popen[bytes] = field(repr=False)
    log_path: Path

    @property
    def issuer(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/jwks"

    @property
    def introspection_url(self) -> str:
        return f"{self.issuer}/token/introspection"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def metadata(self) -> dict[str, Any]:
        """Its RFC 8414 authorization server metadata."""
        async with httpx2.AsyncClient(trust_env=False) as http:
            resp = await http.get(f"{self.issuer}/.well-known/oauth-authorization-server")
            resp.raise_for_status()
            return dict(resp.json())

    async def jwks(self) -> dict[str, Any]:
        """Its JWK Set (RFC 7517 section 5): the public half of the signing key."""
        async with httpx2.AsyncClient(trust_env=False) as http:
            resp = await http.get(self.jwks_url)
            resp.raise_for_status()
            return dict(resp.json())

    async def authorize(self, authorization_url: str, account: str) -> AuthorizationCode:
        """Play the user at ``authorization_url`` (an authorization request built by a client).

        Adds ``login_hint=account`` and follows the provider's redirects (login, consent, back to
        the authorization endpoint) with one cookie jar, up to :data:`MAX_REDIRECTS`; the redirect
        that leaves the provider is the authorization response, read and not followed.

        Raises :class:`AuthServerError` when the provider answers anything but a redirect, or
        redirects with ``error`` (RFC 6749 section 4.1.2.1), e.g. ``access_denied`` for an
        unknown account.
        """
        parts = urlsplit(authorization_url)
        query = urlencode([*parse_qs(parts.query).items(), ("login_hint", [account])], doseq=True)
        url = urlunsplit(parts._replace(query=query))
        async with httpx2.AsyncClient(trust_env=False, follow_redirects=False) as http:
            for _ in range(MAX_REDIRECTS):
                resp = await http.get(url)
                location = resp.headers.get("location")
                if resp.status_code not in (302, 303) or location is None:
                    raise AuthServerError(f"GET {url} answered {resp.status_code}: {resp.text[:500]}")
                url = urljoin(url, location)
                if not url.startswith(self.issuer + "/"):
                    break
            else:
                raise AuthServerError(f"more than {MAX_REDIRECTS} redirects from {authorization_url}")
        params = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
        if "code" not in params:
            raise AuthServerError(f"authorization refused: {params}")
        return AuthorizationCode(params["code"], params.get("state"), params.get("iss"))

    async def mint_token(
        self,
        account: str,
        *,
        resource: str,
        scope: str = " ".join(RESOURCE_SCOPES),
    ) -> str:
        """An access token for ``account`` and ``resource``, by the authorization code flow.

        Registers a public client (RFC 7591), authorizes with PKCE S256 (RFC 7636) and
        ``resource`` (RFC 8707), and exchanges the code. Returns the access token (a JWT unless
        the provider runs with ``token_format="opaque"``). Raises :class:`AuthServerError`.
        """
        async with httpx2.AsyncClient(trust_env=False) as http:
            reg = await http.post(
                f"{self.issuer}/reg",
                json={
                    "redirect_uris": [REDIRECT_URI],
                    "grant_types": ["authorization_code"],
                    "response_types": ["code"],
                    "application_type": "native",
                    "token_endpoint_auth_method": "none",
                },
            )
            if reg.status_code != 201:
                raise AuthServerError(f"registration answered {reg.status_code}: {reg.text[:500]}")
            client_id = str(reg.json()["client_id"])
            verifier = secrets.token_urlsafe(48)
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
            state = secrets.token_urlsafe(16)
            request = {
                "response_type": "code",
                "client_id": client_id,
                "redirect_uri": REDIRECT_URI,
                "state": state,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
                "resource": resource,
                "scope": scope,
            }
            code = await self.authorize(f"{self.issuer}/auth?{urlencode(request)}", account)
            if code.state != state:
                raise AuthServerError(f"state {code.state!r} is not the one sent")
            token = await http.post(
                f"{self.issuer}/token",
                data={
                    "grant_type": "authorization_code",
                    "code": code.code,
                    "redirect_uri": REDIRECT_URI,
                    "client_id": client_id,
                    "code_verifier": verifier,
                    "resource": resource,
                },
            )
            if token.status_code != 200:
                raise AuthServerError(f"token endpoint answered {token.status_code}: {token.text[:500]}")
            return str(token.json()["access_token"])

    async def introspect(self, token: str) -> dict[str, Any]:
        """The provider's RFC 7662 answer for ``token``, asked as the gateway's client."""
        async with httpx2.AsyncClient(trust_env=False) as http:
            resp = await http.post(
                self.introspection_url,
                data={"token": token},
                auth=(INTROSPECTION_CLIENT_ID, INTROSPECTION_CLIENT_SECRET),
            )
            resp.raise_for_status()
            return dict(resp.json())


def _discovery_answers(port: int) -> bool:
    try:
        with DIRECT.open(f"http://{HOST}:{port}/.well-known/openid-configuration", timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class run_authserver:  # used like a function: `async with run_authserver() as idp`
    """Context manager (sync and async) running ``provider.mjs`` on a free 127.0.0.1 port.

    Ready once its discovery document answers 200 (polled every 50 ms, at most
    ``startup_timeout_s`` seconds, else :class:`AuthServerError` with its log).
    ``access_token_ttl_s`` is the tokens' lifetime (seconds); ``token_format`` ``"jwt"`` or
    ``"opaque"``.
    """

    def __init__(
        self,
        *,
        access_token_ttl_s: int = 3600,
        token_format: Literal["jwt", "opaque"] = "jwt",
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.port = free_port()
        self.env = {
            "OIDC_ACCESS_TOKEN_TTL_S": str(access_token_ttl_s),
            "OIDC_ACCESS_TOKEN_FORMAT": token_format,
            "OIDC_INTROSPECTION_CLIENT_ID": INTROSPECTION_CLIENT_ID,
            "OIDC_INTROSPECTION_CLIENT_SECRET": INTROSPECTION_CLIENT_SECRET,
        }
        self.startup_timeout_s = startup_timeout_s
        self.server: AuthServer | None = None

    def _start(self) -> AuthServer:
        fd, log_name = tempfile.mkstemp(prefix=f"oidc-provider-{self.port}-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                [str(NODE), str(SCRIPT), str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                cwd=str(REPO_ROOT),
            )
        self.server = AuthServer(self.port, proc, Path(log_name))
        return self.server

    def _ready(self, server: AuthServer, deadline: float) -> bool:
        if server.process.poll() is not None:
            raise AuthServerError(f"provider.mjs exited with {server.process.returncode}:\n{server.log()}")
        if _discovery_answers(server.port):
            return True
        if time.monotonic() > deadline:
            self._stop()
            raise AuthServerError(
                f"provider.mjs served no discovery document on {HOST}:{server.port}"
                f" within {self.startup_timeout_s} s:\n{server.log()}"
            )
        return False

    def _stop(self) -> None:
        server = self.server
        if server is None or server.process.returncode is not None:
            return
        server.process.terminate()
        try:
            server.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()

    def __enter__(self) -> AuthServer:
        server = self._start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._ready(server, deadline):
            time.sleep(0.05)
        return server

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    async def __aenter__(self) -> AuthServer:
        server = self._start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not await asyncio.to_thread(self._ready, server, deadline):  # noqa: ASYNC110 - polling a child process
            await asyncio.sleep(0.05)
        return server

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self._stop)
