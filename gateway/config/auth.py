"""``[auth]``: who may call the gateway (docs/configuration.md, docs/oauth.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from .base import _Model

__all__ = ["AuthConfig", "StaticToken"]

#: A bearer token of the config: long enough not to be guessed (use ${ENV} or ${file:} references).
Token = Annotated[str, Field(min_length=16)]


class StaticToken(_Model):
    """``[[auth.static]]``: a bearer token that stands for a subject with scopes (a service with
    no identity provider)."""

    token: Token = Field(description="The bearer token (use an ${ENV} reference, at least 16 characters).")
    subject: str = Field(min_length=1, description="Who the token stands for: logs name it, never the token.")
    scopes: tuple[Annotated[str, Field(min_length=1, pattern=r"^[!#-\[\]-~]+$")], ...] = Field(
        (), description="The scopes the caller holds (RFC 6749, 3.3 scope-tokens)."
    )


class AuthConfig(_Model):
    """Downstream authentication: callers must prove who they are with a bearer token."""

    tokens: tuple[Token, ...] = Field(
        (), description="Accepted bearer tokens: callers with no subject, scopes or claims (use ${ENV} references)."
    )
    static: tuple[StaticToken, ...] = Field((), description="Bearer tokens that stand for a subject with scopes.")
    metrics_tokens: tuple[Token, ...] = Field(
        (),
        description="Bearer tokens for GET /metrics (a scraper's own); empty: the caller tokens above.",
    )

    @model_validator(mode="after")
    def _some_caller(self) -> AuthConfig:
        if not self.tokens and not self.static:
            raise ValueError("[auth] accepts no caller: give it tokens or [[auth.static]] entries")
        seen = [*self.tokens, *(s.token for s in self.static)]
        if len(set(seen)) != len(seen):
            raise ValueError("[auth]: the same token is given twice (each token stands for one caller)")
        return self
