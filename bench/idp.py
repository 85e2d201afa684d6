"""``make bench``'s identity provider: a JWK Set and an RFC 7662 introspection endpoint, on 127.0.0.1.

Usage: python bench/idp.py PORT DIR

``DIR/jwks.json`` is served as ``GET /jwks`` (the bench mints its RS256 JWTs itself, with the
private half of that key: bench/auth.py). ``POST /introspect`` (``client_secret_basic`` with
``DIR/client.json``'s ``client_id`` and ``client_secret``) answers a token that starts with
``opaque-`` active, with ``DIR/claims.json``'s claims and ``exp`` an hour from now; anything else
``{"active": false}``. ``GET /_counts`` says how many introspections it answered, so that the
bench can check which of its tokens the gateway introspected and which it answered from its cache.
It answers at once: what the bench measures is the gateway's own cost plus one loopback round trip.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path

from aiohttp import web

HOST = "127.0.0.1"


def app(directory: Path) -> web.Application:
    jwks = (directory / "jwks.json").read_bytes()
    client = json.loads((directory / "client.json").read_text())
    claims = json.loads((directory / "claims.json").read_text())
    expected = "Basic " + base64.b64encode(f"{client['client_id']}:{client['client_secret']}".encode()).decode()
    counts = {"introspect": 0}

    async def keys(_request: web.Request) -> web.Response:
        return web.Response(body=jwks, content_type="application/json")

    async def introspect(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != expected:
            return web.json_response({"error": "invalid_client"}, status=401)
        counts["introspect"] += 1
        token = str((await request.post()).get("token", ""))
        if not token.startswith("opaque-"):
            return web.json_response({"active": False})
        return web.json_response({"active": True, **claims, "exp": int(time.time()) + 3600})

    async def get_counts(_request: web.Request) -> web.Response:
        return web.json_response(counts)

    application = web.Application()
    application.router.add_get("/jwks", keys)
    application.router.add_post("/introspect", introspect)
    application.router.add_get("/_counts", get_counts)
    return application


if __name__ == "__main__":
    web.run_app(app(Path(sys.argv[2])), host=HOST, port=int(sys.argv[1]), print=None, access_log=None)
