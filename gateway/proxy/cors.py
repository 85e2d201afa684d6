"""CORS for browser clients of the MCP and metadata routes (Fetch Standard, 'CORS protocol'),
for the origins in ``listener.allowed_origins``.

* A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed origin is
  answered 204 with the methods, the requested headers that MCP uses (the routing headers of
  MCP 2026-07-28, basic/transports/streamable-http, 'Request Metadata Headers', and
  ``Authorization``), a ``Max-Age`` and ``Vary: Origin``; from any other origin, 403 as the
  ``Origin`` check answers (:mod:`.origin`).
* An answer to an allowed origin carries ``Access-Control-Allow-Origin`` (the origin itself:
  credentials are bearer tokens, never cookies) and ``Access-Control-Expose-Headers`` (what a
  client reads: the challenge, the session and version headers, ``Cache-Status``), added as the
  response is prepared (:meth:`Cors.on_prepare`), streams included.

Without allowed origins the app installs no hook: no cost on any answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from aiohttp import hdrs, web

__all__ = ["ALLOWED_HEADERS", "EXPOSED_HEADERS", "MAX_AGE_S", "Cors"]

#: Request headers a browser client may send (lowercase; ``mcp-param-*`` by prefix).
ALLOWED_HEADERS: Final = frozenset(
    {
        "authorization",
        "content-type",
        "accept",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
        "mcp-session-id",
        "last-event-id",
    }
)
_PARAM_PREFIX: Final = "mcp-param-"
#: Response headers a browser client may read.
EXPOSED_HEADERS: Final = "WWW-Authenticate, Mcp-Session-Id, MCP-Protocol-Version, Cache-Status"
#: How long a browser may reuse a preflight's answer, seconds.
MAX_AGE_S: Final = 600
_MCP_METHODS: Final = "POST, GET, DELETE, OPTIONS"
_METADATA_METHODS: Final = "GET, OPTIONS"


class Cors:
    """CORS for ``origins`` (``listener.allowed_origins``) on the paths :meth:`applies` names."""

    def __init__(self, origins: Iterable[str], metadata_prefix: str) -> None:
        self.origins = frozenset(origins)
        self._metadata_prefix = metadata_prefix

    def applies(self, path: str) -> bool:
        """Whether ``path`` is an MCP or metadata route."""
        return path == "/mcp" or (path.startswith("/servers/") and path.endswith("/mcp")) or self.is_metadata(path)

    def is_metadata(self, path: str) -> bool:
        return path == self._metadata_prefix or path.startswith(self._metadata_prefix + "/")

    def preflight(self, request: web.Request) -> web.Response:
        """The answer to a preflight from an allowed origin (the caller checked the origin)."""
        origin = request.headers.get(hdrs.ORIGIN, "")
        requested = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "")
        allowed = [
            name.strip()
            for name in requested.split(",")
            if (low := name.strip().lower()) in ALLOWED_HEADERS or (low.startswith(_PARAM_PREFIX) and len(low) > 10)
        ]
        headers = {
            hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin,
            hdrs.ACCESS_CONTROL_ALLOW_METHODS: _METADATA_METHODS if self.is_metadata(request.path) else _MCP_METHODS,
            hdrs.ACCESS_CONTROL_MAX_AGE: str(MAX_AGE_S),
            hdrs.VARY: "Origin",
        }
        if allowed:
            headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = ", ".join(allowed)
        return web.Response(status=204, headers=headers)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """An ``on_response_prepare`` hook: the CORS headers of an answer to an allowed origin."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or origin not in self.origins or not self.applies(request.path):
            return
        headers = response.headers
        if hdrs.ACCESS_CONTROL_ALLOW_ORIGIN not in headers:
            headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
            headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSED_HEADERS
            headers.add(hdrs.VARY, "Origin")
