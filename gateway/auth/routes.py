"""``GET /.well-known/oauth-protected-resource[/PATH]``: the protected resource metadata of the
gateway's routes (RFC 9728, 3: path-inserted for ``/servers/NAME/mcp`` and ``/mcp``, and the root)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from .resource import AGGREGATE_PATH, WELL_KNOWN, Resources

__all__ = ["METADATA_ROUTE", "metadata_response"]

#: The aiohttp route of every metadata URL (``tail``: what follows the well-known suffix).
METADATA_ROUTE: Final = WELL_KNOWN + "{tail:.*}"


def metadata_response(resources: Resources, tail: str) -> web.Response:
    """The metadata of the route ``tail`` names (``""``: the root; ``/servers/NAME/mcp``; ``/mcp``),
    after the path of ``public_base_url``. 404 (JSON) for a route that does not exist, or
    without ``[auth.jwt]``, ``[auth.introspection]`` or ``[auth.resource]``."""
    prefix = resources.prefix
    if prefix and (tail == prefix or tail.startswith(prefix + "/")):
        tail = tail[len(prefix) :]
    name: str | None
    if tail and not tail.startswith("/"):  # /.well-known/oauth-protected-resourceX
        name = ""
    elif tail in ("", "/"):
        name = None
    elif tail == AGGREGATE_PATH:
        name = AGGREGATE_PATH
    elif tail.startswith("/servers/") and tail.endswith("/mcp") and tail.count("/") == 3:
        name = tail[len("/servers/") : -len("/mcp")]
    else:
        name = ""
    document = None if name == "" else resources.document(name)
    if document is None:
        return web.json_response({"error": "no protected resource here"}, status=404)
    return web.json_response(document, headers={"Cache-Control": "max-age=300"})
