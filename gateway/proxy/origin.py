"""Which ``Origin`` and ``Host`` values the MCP routes accept: the DNS-rebinding protection.

MCP 2026-07-28, basic/transports/streamable-http, 'Security & Endpoint'
(https://modelcontextprotocol.io/specification/2026-07-28/basic/transports/streamable-http):
servers MUST validate ``Origin`` on every incoming connection, and one that is present and
invalid is answered HTTP 403; local servers SHOULD bind to 127.0.0.1. A DNS-rebinding page
(``evil.example`` re-resolved to 127.0.0.1) reaches a loopback listener with its own name in
``Host`` and its own origin in ``Origin``, so:

* **Origin**: absent, or in ``listener.allowed_origins``, or one of the listener's own origins:
  ``registry.public_base_url``'s origin, and ``http://ADDRESS:PORT`` of the socket the request
  arrived on (its local address and port, so a port chosen at run time counts); on a loopback
  bind ``localhost``, ``127.0.0.1`` and ``[::1]`` with that port alike. Else 403.
* **Host**, on a loopback bind only: absent, or ``localhost``, ``127.0.0.1`` or ``[::1]``, with
  or without a port, or ``registry.public_base_url``'s host. Else 421 Misdirected Request
  (RFC 9110, section 15.5.20: not a name this listener answers for). Any port passes: the name
  is what rebinding changes, and a tunnel or port forward changes the port. Absent passes: a
  browser always sends it, so a request without one is not a rebinding.

A *loopback bind* is a ``listener.host`` that is a loopback address or ``localhost`` AND a
request that arrived on a loopback address: the same config served with ``--host 0.0.0.0``
keeps answering callers that reach it under its public name.

No I/O and no aiohttp: the proxy hands in the header values and the socket's ``sockname``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Final

__all__ = ["LOOPBACK_NAMES", "OriginPolicy", "is_loopback_address", "is_loopback_host"]

#: The names of the loopback interface a browser may put in ``Host`` or an origin.
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: Bound on the ``Host`` values remembered as accepted (see :meth:`OriginPolicy.host_allowed`).
MAX_REMEMBERED_HOSTS: Final = 64
#: Bound on the local addresses whose own origins are remembered.
MAX_REMEMBERED_ADDRESSES: Final = 64
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def is_loopback_address(host: str) -> bool:
    """Whether ``host`` (a bind address or a socket's local address, IPv6 with or without
    brackets) is ``localhost`` or a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z)."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_loopback_host(host: str) -> bool:
    """Whether the ``Host`` value ``host`` is a loopback name, bare or with a port
    (``localhost``, ``127.0.0.1:8080``, ``[::1]:0``; case-insensitive)."""
    host = host.lower()
    if host in LOOPBACK_NAMES:
        return True
    name, colon, port = host.rpartition(":")
    return bool(colon) and name in LOOPBACK_NAMES and _is_port(port)


def _names_address(host: str, sockname: object) -> bool:
    """Whether ``host`` (bare or with a port) is the local address the request arrived on, as
    written in a URL (``127.0.0.2``, ``[::1]``): a listener always answers to its own address."""
    if not isinstance(sockname, tuple) or not sockname:
        return False
    address = str(sockname[0])
    own = f"[{address}]" if ":" in address else address
    name, colon, port = host.rpartition(":")
    if colon and not name.endswith(":") and "]" not in port and _is_port(port):
        host = name
    return host.lower() == own.lower()


def _is_port(text: str) -> bool:
    return 0 < len(text) <= 5 and text.isascii() and text.isdigit() and int(text) <= 65535


def _public_names(public_base_url: str | None) -> tuple[frozenset[str], frozenset[str]]:
    """The origin and the ``Host`` values of ``public_base_url`` (empty without one)."""
    if public_base_url is None:
        return frozenset(), frozenset()
    scheme, _, rest = public_base_url.partition("://")
    scheme = scheme.lower()
    authority = rest.split("/", 1)[0].rsplit("@", 1)[-1].lower()
    name, colon, port = authority.rpartition(":")
    if not colon or name.endswith(":") or "]" in port:  # no port, or a bare IPv6 address
        name, port = authority, ""
    default = _DEFAULT_PORTS.get(scheme)
    if port in ("", str(default)):  # serialized origins leave a default port out
        return frozenset({f"{scheme}://{name}"}), frozenset({name, f"{name}:{default}"})
    return frozenset({f"{scheme}://{name}:{port}"}), frozenset({f"{name}:{port}"})


class OriginPolicy:
    """The ``Origin`` and ``Host`` rules of one gateway (see the module).

    ``bind_host`` is ``listener.host``; ``allowed_origins`` is ``listener.allowed_origins``;
    ``public_base_url`` is ``registry.public_base_url`` as a string, or ``None``.

    The common cases cost one set lookup each, and are tried by the proxy inline:
    ``origin in policy.origins`` (the configured and public origins) and, when
    ``policy.check_host``, ``host in policy.hosts`` (accepted ``Host`` values, filled as they
    are accepted). Only what these miss comes to :meth:`origin_allowed` and
    :meth:`host_allowed`, which look at the socket.
    """

    def __init__(self, bind_host: str, allowed_origins: Iterable[str], public_base_url: str | None) -> None:
        public_origins, public_hosts = _public_names(public_base_url)
        self.origins: frozenset[str] = frozenset(allowed_origins) | public_origins
        self.check_host = is_loopback_address(bind_host)
        # Mutable on purpose: Host values accepted on the slow path are remembered here (up to
        # MAX_REMEMBERED_HOSTS), so that e.g. "127.0.0.1:PORT" with a port chosen at run time
        # costs one lookup from its second request on.
        self.hosts: set[str] = set(LOOPBACK_NAMES | public_hosts)
        self._own: dict[tuple[str, int], frozenset[str]] = {}

    def own_origins(self, sockname: object) -> frozenset[str]:
        """The origins of the listener a request arrived on: ``sockname`` is its socket's local
        address (``(address, port, ...)``, or ``None`` once the connection is gone), built
        once per address and port."""
        if not isinstance(sockname, tuple) or len(sockname) < 2:
            return frozenset()
        address, port = str(sockname[0]), int(sockname[1])
        own = self._own.get((address, port))
        if own is None:
            names = {f"[{address}]" if ":" in address else address}
            if self.check_host and is_loopback_address(address):
                names |= LOOPBACK_NAMES
            suffixes = (f":{port}", "") if port == _DEFAULT_PORTS["http"] else (f":{port}",)
            own = frozenset(f"http://{name}{suffix}" for name in names for suffix in suffixes)
            if len(self._own) < MAX_REMEMBERED_ADDRESSES:
                self._own[address, port] = own
        return own

    def origin_allowed(self, origin: str, sockname: object) -> bool:
        """Whether a present ``Origin`` is allowed (configured, public, or the listener's own)."""
        return origin in self.origins or origin in self.own_origins(sockname)

    def host_allowed(self, host: str, sockname: object) -> bool:
        """Whether a present ``Host`` is allowed, ``sockname`` as for :meth:`own_origins`
        (only asked when :attr:`check_host`)."""
        if host in self.hosts:
            return True
        if is_loopback_host(host) or _names_address(host, sockname):
            if len(self.hosts) < MAX_REMEMBERED_HOSTS:
                self.hosts.add(host)
            return True
        # Not a loopback name: refused on a loopback bind; a listener configured on a loopback
        # host but bound wider (``--host 0.0.0.0``) answers what arrives on other addresses.
        if isinstance(sockname, tuple) and sockname:
            return not is_loopback_address(str(sockname[0]))
        return False
