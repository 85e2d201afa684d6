"""The cluster secret at work: the MAC on every value in Redis, and the digest that names an
upstream's configuration in every shared key.

HMAC-SHA256 (RFC 2104, FIPS 180-4) from the standard library: it takes a key of any length (the
secret as configured), and OpenSSL's one-shot ``hmac.digest`` is the fastest keyed hash this
interpreter has (about 14 µs for a 19 KB ``tools/list``, against about 23 µs for keyed
BLAKE2b). Each use (:data:`USES`: shared entries, feed events, the registry's shared state) has
its own key, derived from the secret by HMAC-SHA256 over the use's label, so a MAC of one kind
never passes for another.

Without ``[cluster].secret`` (allowed only with Redis on loopback) the key is :data:`NO_SECRET`,
fixed and public: it catches torn or stray writes, not anyone who can write to that Redis.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from ..config import GatewayConfig

__all__ = ["MAC_BYTES", "NO_SECRET", "USES", "Keys"]

#: The key used without ``[cluster].secret``: public, so no protection against a writer.
NO_SECRET: Final = b"mcp-gateway: no [cluster].secret configured"
#: Length of a value's MAC, in bytes (HMAC-SHA256, untruncated).
MAC_BYTES: Final = 32
#: What a MAC may be for: a shared entry, an event of the feed, the registry's shared state.
USES: Final = ("value", "event", "state")
#: Length of an upstream configuration's digest, in bytes (hex in keys: twice as many characters).
IDENTITY_BYTES: Final = 12


class Keys:
    """The keys of one gateway's cluster, derived from ``[cluster].secret`` (or :data:`NO_SECRET`)."""

    def __init__(self, secret: str | None) -> None:
        root = secret.encode() if secret is not None else NO_SECRET
        self._mac_keys = {use: hmac.digest(root, f"mcp-gateway {use} mac v1".encode(), "sha256") for use in USES}
        self._identity_key = hmac.digest(root, b"mcp-gateway upstream identity v1", "sha256")

    def mac(self, data: bytes | memoryview, use: str = "value") -> bytes:
        """The :data:`MAC_BYTES`-byte HMAC-SHA256 of ``data`` for ``use`` (one of :data:`USES`).

        Raises:
            KeyError: ``use`` is not one of :data:`USES`.
        """
        return hmac.digest(self._mac_keys[use], data, "sha256")

    def verify(self, data: bytes | memoryview, mac: object, use: str = "value") -> bool:
        """Whether ``mac`` is the MAC of ``data`` for ``use`` (compared in constant time)."""
        if not isinstance(mac, bytes | memoryview):
            return False
        return hmac.compare_digest(self.mac(data, use), mac)

    def identity(self, config: GatewayConfig, upstream: str) -> str:
        """Hex digest (:data:`IDENTITY_BYTES` bytes) of what makes ``upstream``'s answers what they
        are: its ``url``, its ``headers`` (names case-folded, values exact), ``forward_authorization``
        and ``vary_on_client_capabilities`` as resolved for it. Two processes share an entry, a lock,
        a generation or a lease of ``upstream`` only when these agree. Keyed, so that the digest
        of a header holding a token tells nothing about the token."""
        up = config.upstreams[upstream]
        parts = [
            b"url",
            str(up.url).encode(),
            b"forward_authorization",
            b"1" if up.forward_authorization else b"0",
            b"vary_on_client_capabilities",
            b"1" if config.vary_on_capabilities(upstream) else b"0",
        ]
        for name, value in sorted((k.lower(), v) for k, v in up.headers.items()):
            parts += [b"header", name.encode(), value.encode()]
        h = hmac.new(self._identity_key, digestmod=hashlib.sha256)
        for part in parts:  # length-prefixed: no two configurations share an encoding
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
        return h.digest()[:IDENTITY_BYTES].hex()

    def identities(self, config: GatewayConfig) -> dict[str, str]:
        """:meth:`identity` of every upstream of ``config``, by name."""
        return {name: self.identity(config, name) for name in config.upstreams}
