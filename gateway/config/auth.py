"""``[auth]``: who may call the gateway (docs/configuration.md, docs/oauth.md)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from .base import _Model

__all__ = ["AuthConfig", "IntrospectionConfig", "JwtConfig", "ResourceConfig", "StaticToken", "loopback_host"]

#: A bearer token of the config: long enough not to be guessed (use ${ENV} or ${file:} references).
Token = Annotated[str, Field(min_length=16)]
#: A scope-token (RFC 6749, 3.3).
Scope = Annotated[str, Field(min_length=1, pattern=r"^[!#-\[\]-~]+$")]
DEFAULT_LEEWAY_S: Final = 30.0
DEFAULT_SCOPE_CLAIMS: Final = ("scope", "scp")
DEFAULT_JWKS_MIN_REFETCH_S: Final = 30.0
DEFAULT_INTROSPECTION_CACHE_S: Final = 60.0
#: Asymmetric JWS algorithms PyJWT verifies (RFC 7518, 3.1; RFC 8037): the only ones a resource
#: server that holds no shared secret can check. "none" and HS* are refused (algorithm confusion).
ASYMMETRIC_ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES256K", "ES384", "ES512", "EdDSA"}
)


def loopback_host(host: str) -> bool:
    """Whether ``host`` (a URL's host name) is ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def identity_provider_url(value: str, key: str) -> str:
    """``value`` if it is an ``https://`` URL, or ``http://`` to a loopback host (a plain-text
    key set or token answer could be forged on the way). Raises ValueError naming ``key``."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{key} must be an https:// URL, got {value!r}")
    if parts.scheme == "http" and not loopback_host(parts.hostname):
        raise ValueError(
            f"{key} must use https:// (plain http:// only to a loopback host: 127.0.0.0/8, ::1, localhost), "
            f"got {value!r}"
        )
    return value


class StaticToken(_Model):
    """``[[auth.static]]``: a bearer token that stands for a subject with scopes (a service with
    no identity provider)."""

    token: Token = Field(description="The bearer token (use an ${ENV} reference, at least 16 characters).")
    subject: str = Field(min_length=1, description="Who the token stands for: logs name it, never the token.")
    scopes: tuple[Scope, ...] = Field((), description="The scopes the caller holds (RFC 6749, 3.3 scope-tokens).")


class JwtConfig(_Model):
    """``[auth.jwt]``: access tokens are JWTs (RFC 9068) signed by one issuer's keys."""

    issuer: str = Field(min_length=1, description='Compared exactly with the token\'s "iss".')
    jwks_url: str = Field(
        description="The issuer's JSON Web Key Set: https (plain http to loopback only); redirects not followed."
    )
    audiences: tuple[str, ...] = Field(
        (), description='Accepted "aud" values besides the resource URI of the route called (RFC 8707).'
    )
    algorithms: tuple[str, ...] = Field(
        min_length=1, description='Accepted signature algorithms (required; "none" and HS* are refused).'
    )
    leeway_s: float = Field(DEFAULT_LEEWAY_S, ge=0, le=300, description='Clock skew allowed on "exp"/"nbf", seconds.')
    scope_claims: tuple[str, ...] = Field(
        DEFAULT_SCOPE_CLAIMS,
        min_length=1,
        description="Claims holding the token's scopes (a space-separated string or a list), all read.",
    )
    required_scopes: tuple[Scope, ...] = Field((), description="Scopes every MCP request needs (else 403).")
    jwks_min_refetch_s: float = Field(
        DEFAULT_JWKS_MIN_REFETCH_S,
        ge=0,
        description="An unknown kid refetches the key set at most this often, seconds.",
    )

    @field_validator("jwks_url")
    @classmethod
    def _jwks_url(cls, value: str) -> str:
        return identity_provider_url(value, "jwks_url")

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for alg in value:
            if alg.lower() == "none" or alg.upper().startswith("HS"):
                kind = "an unsigned token" if alg.lower() == "none" else "a shared-secret"
                raise ValueError(
                    f"algorithm {alg!r} is refused: {kind} algorithm lets anyone who knows the public key "
                    "mint tokens (use RS*, PS*, ES* or EdDSA)"
                )
            if alg not in ASYMMETRIC_ALGORITHMS:
                raise ValueError(f"unknown algorithm {alg!r} (known: {', '.join(sorted(ASYMMETRIC_ALGORITHMS))})")
        return value


class IntrospectionConfig(_Model):
    """``[auth.introspection]``: opaque tokens checked at the issuer's introspection endpoint
    (RFC 7662), authenticated with ``client_secret_basic``."""

    url: str = Field(description="The introspection endpoint: https (plain http to loopback only).")
    client_id: str = Field(min_length=1, description="The gateway's client id at the authorization server.")
    client_secret: str = Field(min_length=1, description="Its client secret (use an ${ENV} reference).")
    cache_s: float = Field(
        DEFAULT_INTROSPECTION_CACHE_S, ge=0, description='One answer reused at most this long, never past its "exp".'
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return identity_provider_url(value, "url")


class ResourceConfig(_Model):
    """``[auth.resource]``: what the protected resource metadata says (RFC 9728)."""

    public_base_url: str | None = Field(
        None,
        description="How callers reach the gateway, the base of every resource URI (never taken from Host; "
        "default: [registry].public_base_url).",
    )
    authorization_servers: tuple[str, ...] = Field(
        (), description="Issuers callers get tokens from (default: [issuer])."
    )
    scopes_supported: tuple[Scope, ...] = Field(
        (), description="Scopes the metadata lists (default: required_scopes and every policy rule's scopes)."
    )

    @field_validator("public_base_url")
    @classmethod
    def _base(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"public_base_url must be an http(s) URL without query or fragment, got {value!r}")
        # RFC 8707 / MCP canonical URI: lowercase scheme and host, no trailing slash.
        return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"

    @field_validator("scopes_supported")
    @classmethod
    def _no_offline_access(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if "offline_access" in value:
            # MCP 2026-07-28, basic/authorization, 'Scope Selection Strategy': not advertised.
            raise ValueError("scopes_supported: offline_access must not be advertised by a resource server")
        return value


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
    jwt: JwtConfig | None = Field(None, description="Access tokens that are JWTs (OAuth 2.1 resource server).")
    introspection: IntrospectionConfig | None = Field(None, description="Opaque access tokens (RFC 7662).")
    resource: ResourceConfig | None = Field(None, description="The protected resource metadata (RFC 9728).")

    @model_validator(mode="after")
    def _some_caller(self) -> AuthConfig:
        if not self.tokens and not self.static and self.jwt is None and self.introspection is None:
            raise ValueError(
                "[auth] accepts no caller: give it tokens, [[auth.static]] entries, [auth.jwt] or [auth.introspection]"
            )
        seen = [*self.tokens, *(s.token for s in self.static)]
        if len(set(seen)) != len(seen):
            raise ValueError("[auth]: the same token is given twice (each token stands for one caller)")
        return self

    @property
    def verifies(self) -> bool:
        """Whether tokens are checked with an identity provider (``[auth.jwt]`` or ``[auth.introspection]``)."""
        return self.jwt is not None or self.introspection is not None

    @property
    def required_scopes(self) -> tuple[str, ...]:
        """The scopes every MCP request needs (``[auth.jwt].required_scopes``)."""
        return () if self.jwt is None else self.jwt.required_scopes

    def public_base(self, registry_base: str | None) -> str | None:
        """The base of the gateway's resource URIs: ``[auth.resource].public_base_url``, else
        ``registry_base`` (``[registry].public_base_url``), canonical (no trailing slash)."""
        if self.resource is not None and self.resource.public_base_url is not None:
            return self.resource.public_base_url
        if registry_base is None:
            return None
        parts = urlsplit(registry_base)
        return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"

    def authorization_servers(self) -> tuple[str, ...]:
        """``[auth.resource].authorization_servers``, else the JWT issuer (RFC 9728, 2)."""
        if self.resource is not None and self.resource.authorization_servers:
            return self.resource.authorization_servers
        return () if self.jwt is None else (self.jwt.issuer,)

    def check_resource(self, registry_base: str | None) -> None:
        """Raises ValueError when tokens are verified but no base URL names the resources."""
        if (self.verifies or self.resource is not None) and self.public_base(registry_base) is None:
            raise ValueError(
                "[auth.resource] public_base_url is required with [auth.jwt] or [auth.introspection] (the "
                "resource URIs tokens are issued for; never taken from Host), or set [registry].public_base_url"
            )
        if (self.verifies or self.resource is not None) and not self.authorization_servers():
            raise ValueError(
                "[auth.resource] authorization_servers is required without [auth.jwt] (the protected resource "
                "metadata names at least one)"
            )
