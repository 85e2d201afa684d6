"""The gateway's own callers: who they are (:mod:`.caller`) and how they prove it (plain and
static bearer tokens, :mod:`.tokens`; JWTs, :mod:`.jwts` with :mod:`.keys`; introspected
tokens, :mod:`.introspection`), all behind :class:`Authenticator`; the gateway as a protected
resource (RFC 9728, :mod:`.resource`).

Modules, lowest first: ``caller`` (the identity every later step reads), ``verdict``,
``tokens``, ``fetch``, ``keys``, ``jwts``, ``introspection``, ``resource``, ``authenticator``.
"""

from .authenticator import MAX_REMEMBERED, Authenticator
from .caller import ANONYMOUS, Caller, CallerKind
from .fetch import IdentityProviderError, SessionSource
from .resource import WELL_KNOWN, Resources
from .tokens import StaticCallers, bearer_matches, bearer_token, token_context
from .verdict import AUTH_OUTCOMES, EXPIRED, INVALID, MISSING, AuthOutcome, Verdict

__all__ = [
    "ANONYMOUS",
    "AUTH_OUTCOMES",
    "EXPIRED",
    "INVALID",
    "MAX_REMEMBERED",
    "MISSING",
    "WELL_KNOWN",
    "AuthOutcome",
    "Authenticator",
    "Caller",
    "CallerKind",
    "IdentityProviderError",
    "Resources",
    "SessionSource",
    "StaticCallers",
    "Verdict",
    "bearer_matches",
    "bearer_token",
    "token_context",
]
