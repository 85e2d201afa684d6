"""Who is calling: the one identity every later step (policy, the private cache, the access log)
reads, whatever proved it (a plain token, an ``[[auth.static]]`` token, a JWT, an introspected
token)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = ["ANONYMOUS", "Caller", "CallerKind"]

#: What proved the caller: ``none`` without ``[auth]``; ``token`` a plain ``auth.tokens`` entry.
CallerKind = Literal["none", "token", "static", "jwt", "introspection"]


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller (immutable, shared by every request with the same token).

    * ``kind``: what proved it (:data:`CallerKind`).
    * ``subject``: ``sub`` of a JWT or an introspection answer, or ``[[auth.static]].subject``;
      ``None`` for a plain token or without ``[auth]``. The only part of a caller that logs name.
    * ``scopes``: the scopes it holds (a plain token holds none).
    * ``claims``: the JWT payload or the introspection answer (``{}`` otherwise); policy reads
      dotted paths of it (``realm_access.roles``).
    * ``context``: a SHA-256 of the presented token (32 bytes; ``b""`` without a token): the
      authorization context that ``private`` answers are kept for. Never the token itself.
    * ``expires_at``: when the token stops being valid, in wall-clock seconds since the epoch
      (``exp``), or ``None`` for tokens that do not expire.
    """

    kind: CallerKind
    subject: str | None = None
    scopes: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    context: bytes = b""
    expires_at: float | None = None


#: The caller of a gateway without ``[auth]``.
ANONYMOUS: Final = Caller("none")
