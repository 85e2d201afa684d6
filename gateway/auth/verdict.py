"""What checking a bearer token found: a :class:`Verdict`, remembered per token and read on
every request with that token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from .caller import Caller

__all__ = ["AUTH_OUTCOMES", "EXPIRED", "INVALID", "MISSING", "AuthOutcome", "Verdict", "scopes_of"]

#: The ``outcome`` label of ``mcp_gateway_auth_total``: ``ok``, ``missing`` (no bearer token),
#: ``invalid``, ``expired``, ``insufficient_scope`` (lacks ``required_scopes``, or a policy's
#: scope challenge) and ``denied`` (a policy refusal).
AuthOutcome = Literal["ok", "missing", "invalid", "expired", "insufficient_scope", "denied"]
AUTH_OUTCOMES: Final[tuple[AuthOutcome, ...]] = ("ok", "missing", "invalid", "expired", "insufficient_scope", "denied")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a token proved, whatever route it is presented on.

    * ``outcome``: ``ok`` (``caller`` set), ``missing``, ``invalid`` or ``expired``.
    * ``caller``: who it stands for (:class:`Caller`), ``None`` unless ``ok``.
    * ``audiences``: the resource URIs (``aud``, RFC 8707) the token may be used for; ``None``:
      every route (a static token, one issued for a configured ``audiences`` entry, or an
      introspection answer without ``aud``). Checked per route, on every request.
    * ``until``: remembered until then, wall-clock seconds (``exp`` plus the leeway, or the
      introspection answer's reuse limit); ``inf`` for static tokens.
    """

    outcome: Literal["ok", "missing", "invalid", "expired"]
    caller: Caller | None = None
    audiences: frozenset[str] | None = None
    until: float = math.inf

    def accepts(self, resource: str) -> bool:
        """Whether the token is valid on the route whose resource URI is ``resource``."""
        return self.caller is not None and (self.audiences is None or resource in self.audiences)


MISSING: Final = Verdict("missing")
INVALID: Final = Verdict("invalid")
EXPIRED: Final = Verdict("expired")


def scopes_of(value: object) -> frozenset[str]:
    """The scopes of a claim: a space-separated string (RFC 8693, 4.2; RFC 7662, 2.2) or a list
    of strings (Entra's ``roles``, some IdPs' ``scp``); anything else holds none."""
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(s for s in value if isinstance(s, str) and s)
    return frozenset()


def audiences_of(value: object) -> frozenset[str]:
    """``aud`` as a set: a string or a list of strings (RFC 7519, 4.1.3); else empty."""
    if isinstance(value, str):
        return frozenset((value,))
    if isinstance(value, list):
        return frozenset(a for a in value if isinstance(a, str))
    return frozenset()
