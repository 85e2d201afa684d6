"""The gateway's own callers: who they are (:mod:`.caller`) and how they prove it (plain and
static bearer tokens, :mod:`.tokens`).

Modules, lowest first: ``caller`` (the identity every later step reads), ``tokens``.
"""

from .caller import ANONYMOUS, Caller, CallerKind
from .tokens import StaticCallers, bearer_matches, bearer_token, token_context

__all__ = ["ANONYMOUS", "Caller", "CallerKind", "StaticCallers", "bearer_matches", "bearer_token", "token_context"]
