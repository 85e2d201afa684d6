"""The gateway as a protected resource (RFC 9728): the resource URI of each MCP route, the URL
of its metadata, and the metadata document itself."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from ..config import UPSTREAM_NAME_PATTERN

if TYPE_CHECKING:
    from ..config import GatewayConfig

__all__ = ["AGGREGATE_PATH", "WELL_KNOWN", "Resources"]

#: RFC 9728, 3: the well-known suffix, inserted before the resource's path (3.1).
WELL_KNOWN: Final = "/.well-known/oauth-protected-resource"
#: The path of ``POST /mcp`` (``gateway.aggregate.ROUTE``: the route's name in an exchange).
AGGREGATE_PATH: Final = "/mcp"

#: What an upstream name may be (the config's rule): any such name has a metadata document.
_UPSTREAM_NAME: Final = re.compile(UPSTREAM_NAME_PATTERN)


def route_path(name: str) -> str:
    """The path of the MCP route an exchange names: ``/mcp``, or ``/servers/NAME/mcp``."""
    return AGGREGATE_PATH if name == AGGREGATE_PATH else f"/servers/{name}/mcp"


class Resources:
    """The resource URIs and metadata of ``config``'s gateway, from ``public_base_url``
    (``[auth.resource]``, else ``[registry]``). Without one (no ``[auth]``, or static tokens
    only) there is no metadata: :attr:`base` is ``None`` and challenges name none."""

    def __init__(self, config: GatewayConfig) -> None:
        auth = config.auth
        registry_base = config.registry.public_base_url
        base = None if auth is None else auth.public_base(None if registry_base is None else str(registry_base))
        self.base = base
        self.authorization_servers = () if auth is None else auth.authorization_servers()
        self.scopes_supported: tuple[str, ...] = ()
        if auth is not None:
            configured = () if auth.resource is None else auth.resource.scopes_supported
            # By default every scope the gateway asks for: the required ones and those of the
            # rules (a client registers with these and may ask for no others later).
            named = dict.fromkeys((*auth.required_scopes, *(s for r in config.policy.rules for s in r.scopes)))
            self.scopes_supported = configured or tuple(named)
        #: Whether the metadata routes answer (``[auth.jwt]``, ``[auth.introspection]`` or ``[auth.resource]``).
        self.published = base is not None and auth is not None and (auth.verifies or auth.resource is not None)
        self.aggregate = config.aggregate is not None
        self.upstreams = frozenset(config.upstreams)
        if base is None:
            self._origin = self._prefix = ""
        else:
            parts = urlsplit(base)
            self._origin, self._prefix = f"{parts.scheme}://{parts.netloc}", parts.path
        #: The path of ``public_base_url`` (``""`` at the root), inserted before each route's path.
        self.prefix = self._prefix
        # Computed once for the configured routes (every request asks for its own).
        self._uris = {n: self._uri(n) for n in (*config.upstreams, AGGREGATE_PATH)}
        self._metadata_urls = {n: self._metadata_url(n) for n in self._uris}
        #: Every resource URI of the gateway: what a token for the registry routes may be for.
        self.all_uris = frozenset(self._uris.values()) | ({base} if base else frozenset())
        self.root_metadata_url = f"{self._origin}{WELL_KNOWN}{self._prefix}" if base else None

    def _uri(self, name: str) -> str:
        return f"{self.base}{route_path(name)}"

    def _metadata_url(self, name: str) -> str:
        return f"{self._origin}{WELL_KNOWN}{self._prefix}{route_path(name)}"

    def uri(self, name: str) -> str:
        """The resource URI of the route an exchange names (``name``: an upstream, or ``/mcp``)."""
        uri = self._uris.get(name)
        return uri if uri is not None else self._uri(name)

    def metadata_url(self, name: str) -> str | None:
        """The metadata URL of that route (RFC 9728, 3.1: path-inserted), ``None`` without metadata."""
        if not self.published:
            return None
        url = self._metadata_urls.get(name)
        return url if url is not None else self._metadata_url(name)

    def document(self, name: str | None) -> dict[str, Any] | None:
        """The metadata of the route (``name`` as in :meth:`uri`; ``None``: the root, whose
        ``resource`` is ``public_base_url``), or ``None`` for ``/mcp`` without ``[aggregate]``
        and for a name no upstream could have. Any other upstream name has its document, configured
        or not: callers learn which upstreams exist only once authenticated (and then only those
        their rules allow). RFC 9728, 2."""
        if not self.published or self.base is None:
            return None
        if name is None:
            resource = self.base
        elif (name == AGGREGATE_PATH and self.aggregate) or name in self.upstreams or _UPSTREAM_NAME.fullmatch(name):
            resource = self.uri(name)
        else:
            return None
        document: dict[str, Any] = {
            "resource": resource,
            "authorization_servers": list(self.authorization_servers),
            "scopes_supported": list(self.scopes_supported),
            "bearer_methods_supported": ["header"],
        }
        return document
