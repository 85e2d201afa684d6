"""A fixture identity provider on 127.0.0.1: a JWKS and an RFC 7662 introspection endpoint served
by aiohttp, with fault modes, and access tokens minted with PyJWT from RSA and EC keys made with
``cryptography``.

    idp = await start_idp()                          # the tests/auth fixture; idp.jwks_url is set
    token = idp.mint(aud=gateway_resource)           # RS256, kid "rsa-1", iss idp.issuer, exp in 5 min
    token = idp.mint(key="ec", aud=...)              # ES256, kid "ec-1"
    idp.jwks_mode = "html"                           # "ok", "html", "huge" (2 MB), "slow", "empty"
    await idp.stop(); await idp.start()              # down, then back on the same port
    idp.rotate()                                     # a new RSA key (a new kid) replaces the old one
    idp.introspection["opaque-token"] = {"active": True, "sub": "alice", "scope": "mcp:read"}
    idp.jwks_fetches, idp.introspections             # requests served so far
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, Literal

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = ["CLIENT_ID", "CLIENT_SECRET", "FixtureIdp", "JwksMode"]

CLIENT_ID = "mcp-gateway"
CLIENT_SECRET = "introspection-secret-0123456789"
JwksMode = Literal["ok", "html", "huge", "slow", "empty"]
#: How long "slow" answers take, seconds (longer than the gateway's fetch timeout in the tests).
SLOW_S = 6.0


class FixtureIdp:
    """See the module. Not started until :meth:`start`."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.rsa_kid = "rsa-1"
        self.ec_kid = "ec-1"
        self._generation = 1
        self.jwks_mode: JwksMode = "ok"
        self.introspection_mode: JwksMode = "ok"
        #: Introspection answers by token; a token not here is ``{"active": false}``.
        self.introspection: dict[str, dict[str, Any]] = {}
        self.jwks_fetches = 0
        self.introspections = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    # -- serving ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve on 127.0.0.1 (the same port as before, after a :meth:`stop`)."""
        app = web.Application()
        app.router.add_get("/jwks", self._jwks)
        app.router.add_post("/introspect", self._introspect)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if not self.port:
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Stop serving: connections to the port are refused until :meth:`start`."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}/realms/mcp"

    @property
    def jwks_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks"

    @property
    def introspection_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/introspect"

    def jwks(self) -> dict[str, Any]:
        """The key set as served now (public keys only)."""
        rsa_jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key(), as_dict=True)
        ec_jwk = jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key(), as_dict=True)
        return {
            "keys": [
                {**rsa_jwk, "kid": self.rsa_kid, "use": "sig", "alg": "RS256"},
                {**ec_jwk, "kid": self.ec_kid, "use": "sig", "alg": "ES256"},
            ]
        }

    async def _faulty(self, mode: JwksMode) -> web.Response | None:
        if mode == "html":
            return web.Response(text="<html><body>Service Unavailable</body></html>", content_type="text/html")
        if mode == "huge":
            return web.json_response({"keys": [], "padding": "x" * (2 * 1024 * 1024)})
        if mode == "slow":
            await asyncio.sleep(SLOW_S)
            return web.json_response({"keys": []})
        if mode == "empty":
            return web.json_response({"keys": []})
        return None

    async def _jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        return await self._faulty(self.jwks_mode) or web.json_response(self.jwks())

    async def _introspect(self, request: web.Request) -> web.Response:
        self.introspections += 1
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.json_response({"error": "invalid_client"}, status=401)
        faulty = await self._faulty(self.introspection_mode)
        if faulty is not None:
            return faulty
        form = await request.post()
        answer = self.introspection.get(str(form.get("token")), {"active": False})
        return web.json_response(answer)

    # -- keys and tokens ----------------------------------------------------------------------

    def rotate(self) -> None:
        """A new RSA signing key under a new ``kid``; the old one leaves the set."""
        self._generation += 1
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.rsa_kid = f"rsa-{self._generation}"

    def mint(
        self,
        *,
        aud: str | list[str],
        key: Literal["rsa", "ec"] = "rsa",
        expires_in_s: float = 300,
        headers: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A signed access token: ``iss`` this issuer, ``sub`` ``alice``, ``exp`` ``expires_in_s``
        from now; ``claims`` override or add (``iss=...``, ``scope="a b"``, ``sub=...``)."""
        now = int(time.time())
        payload = {"iss": self.issuer, "sub": "alice", "aud": aud, "iat": now, "exp": now + int(expires_in_s)}
        payload.update(claims)
        if key == "rsa":
            return jwt.encode(payload, self.rsa, algorithm="RS256", headers={"kid": self.rsa_kid, **(headers or {})})
        return jwt.encode(payload, self.ec, algorithm="ES256", headers={"kid": self.ec_kid, **(headers or {})})
