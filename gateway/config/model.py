"""The config file's model: one frozen pydantic tree, a class per table, with its defaults and
checks (docs/configuration.md). Loading it from TOML is :mod:`.load`."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Annotated, Final
from urllib.parse import parse_qsl, urlsplit

from pydantic import ConfigDict, Field, HttpUrl, ValidationInfo, field_validator, model_validator

from .auth import AuthConfig, IntrospectionConfig, JwtConfig, ResourceConfig, StaticToken, loopback_host
from .base import _Model, located_error
from .policy import PolicyConfig, check_rule_callers, check_rule_upstreams

__all__ = [
    "AGGREGATE_SERVER_NAME",
    "AdminConfig",
    "AuthConfig",
    "CacheConfig",
    "ClusterConfig",
    "GatewayConfig",
    "IntrospectionConfig",
    "JwtConfig",
    "ListenerConfig",
    "RegistryConfig",
    "ResourceConfig",
    "StaticToken",
    "UpstreamConfig",
]

#: An HTTP header name (RFC 9110, 5.6.2 token), and what a header value may not hold (5.5).
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8080
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
DEFAULT_MAX_ENTRIES: Final = 10_000
DEFAULT_MAX_ENTRY_BYTES: Final = 4 * 1024 * 1024
DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024
DEFAULT_MAX_TTL_MS: Final = 3_600_000
DEFAULT_STALE_IF_ERROR_MS: Final = 0
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_CONNECT_TIMEOUT_S: Final = 5.0
DEFAULT_STREAM_IDLE_TIMEOUT_S: Final = 300.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_INFLIGHT: Final = 256
DEFAULT_MAX_LISTEN_STREAMS: Final = 1024
DEFAULT_BODY_TIMEOUT_S: Final = 10.0
DEFAULT_WRITE_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_QUEUED_BYTES: Final = 64 * 1024 * 1024
DEFAULT_PROBE_MIN_INTERVAL_S: Final = 10.0
DEFAULT_PROBE_MAX_INTERVAL_S: Final = 300.0
DEFAULT_PROBE_TIMEOUT_S: Final = 10.0
DEFAULT_BACKOFF_BASE_S: Final = 1.0
DEFAULT_BACKOFF_MAX_S: Final = 120.0
DEFAULT_SERVER_NAMESPACE: Final = "local.mcp-gateway"
DEFAULT_KEY_PREFIX: Final = "mcp-gateway"
DEFAULT_REDIS_TIMEOUT_S: Final = 0.25
#: Shortest ``[cluster].secret``, in bytes (UTF-8).
MIN_CLUSTER_SECRET_BYTES: Final = 16

UPSTREAM_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
#: What ``/v0.1/servers`` calls ``POST /mcp`` (after the namespace); no upstream may have it then.
AGGREGATE_SERVER_NAME: Final = "aggregate"


class ListenerConfig(_Model):
    """Where the gateway binds and what it accepts from downstream."""

    host: str = Field(DEFAULT_HOST, description="Address to bind.")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="TCP port to bind (0: any free port).")
    allowed_origins: tuple[str, ...] = Field(
        (), description="Origins allowed to call the MCP routes; a request with another Origin gets 403."
    )
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES, gt=0, description="Largest request body accepted, in bytes (else 413)."
    )
    body_timeout_s: float = Field(
        DEFAULT_BODY_TIMEOUT_S,
        gt=0,
        description="Time allowed to send a request body once its headers arrived, in seconds (else 408).",
    )
    write_timeout_s: float = Field(
        DEFAULT_WRITE_TIMEOUT_S,
        gt=0,
        description="A caller whose connection accepts no bytes of an answer for this long is disconnected, "
        "in seconds (a caller that keeps reading, however slowly, is not).",
    )
    max_queued_bytes: int = Field(
        DEFAULT_MAX_QUEUED_BYTES,
        ge=64 * 1024,
        description="Most bytes of answers handed to callers' connections and not yet taken by them, all "
        "connections of a process together (at most 64 KiB each, beyond what the connection itself "
        "buffers), in bytes; a writer that finds no room waits for it, at most write_timeout_s, while the "
        "connection holding room that has taken nothing for the longest (1 s at least) is dropped to make room.",
    )


class CacheConfig(_Model):
    """Bounds of the shared result cache."""

    max_entries: int = Field(DEFAULT_MAX_ENTRIES, ge=0, description="Most cache entries kept (0 disables caching).")
    max_entry_bytes: int = Field(
        DEFAULT_MAX_ENTRY_BYTES, gt=0, description="Larger results are forwarded but not stored, in bytes."
    )
    max_bytes: int = Field(DEFAULT_MAX_BYTES, gt=0, description="Total size of all stored results, in bytes.")
    max_ttl_ms: int = Field(
        DEFAULT_MAX_TTL_MS, gt=0, description="Ceiling on any upstream ttlMs, in milliseconds; never a floor."
    )
    vary_on_client_capabilities: bool = Field(
        True, description="Key entries on the request's clientCapabilities (default for every upstream)."
    )
    stale_if_error_ms: int = Field(
        DEFAULT_STALE_IF_ERROR_MS,
        ge=0,
        description="Keep an expired public entry this long past its expiry, and serve it (ttlMs 0) only "
        "when fetching it again fails, in milliseconds (0: never serve stale; default for every upstream).",
    )
    refresh_ahead: bool = Field(
        False,
        description="Fetch an entry again in the background when it is asked for in the last part of its "
        "lifetime (default for every upstream).",
    )
    private_per_identity: bool = Field(
        False, description="Store private answers, each for its caller's authorization context only."
    )


class AdminConfig(_Model):
    """The admin routes; without this table they do not exist."""

    token: str = Field(min_length=16, description="Bearer token for /admin routes (use an ${ENV} reference).")


class UpstreamConfig(_Model):
    """One MCP server behind the gateway, reached at ``/servers/{name}/mcp``."""

    url: HttpUrl = Field(description="The upstream's MCP endpoint (http or https).")
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="Whole request, non-streaming, in seconds.")
    connect_timeout_s: float = Field(DEFAULT_CONNECT_TIMEOUT_S, gt=0, description="TCP connect, in seconds.")
    stream_idle_timeout_s: float = Field(
        DEFAULT_STREAM_IDLE_TIMEOUT_S,
        gt=0,
        description="An SSE stream with no bytes (keep-alives count) for this long is closed, in seconds.",
    )
    headers: Mapping[str, str] = Field(default_factory=dict, description="Headers sent to this upstream only.")
    forward_authorization: bool = Field(False, description="Pass the caller's Authorization to this upstream.")
    vary_on_client_capabilities: bool | None = Field(
        None, description="Override of [cache].vary_on_client_capabilities for this upstream."
    )
    stale_if_error_ms: int | None = Field(
        None, ge=0, description="Override of [cache].stale_if_error_ms for this upstream, in milliseconds."
    )
    refresh_ahead: bool | None = Field(None, description="Override of [cache].refresh_ahead for this upstream.")
    max_response_bytes: int = Field(
        DEFAULT_MAX_RESPONSE_BYTES, gt=0, description="Largest non-streamed upstream response, in bytes (else 502)."
    )
    max_inflight: int = Field(
        DEFAULT_MAX_INFLIGHT, gt=0, description="Concurrent requests to this upstream before 503 + Retry-After."
    )
    max_listen_streams: int = Field(
        DEFAULT_MAX_LISTEN_STREAMS,
        gt=0,
        description="Callers' subscriptions/listen streams open to this upstream at once, apart from "
        "max_inflight (else 503 + Retry-After).",
    )

    @field_validator("headers")
    @classmethod
    def _no_hop_headers(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        banned = {"host", "content-length", "transfer-encoding", "connection"}
        bad = sorted(k for k in value if k.lower() in banned)
        if bad:
            raise ValueError(f"headers may not set {', '.join(bad)}")
        # What could never be sent (RFC 9110, 5.1 and 5.5: a name is a token; a value has no
        # CR, LF, NUL or other control character but tab), a ${file:} secret's included: a load
        # error now, not a 500 on every request to the upstream.
        names = sorted(k for k in value if not _TOKEN.fullmatch(k))
        if names:
            raise ValueError(f"header names must be tokens: {', '.join(map(repr, names))}")
        values = sorted(k for k, v in value.items() if _CONTROL.search(v))
        if values:
            raise ValueError(f"header values may not hold control characters: {', '.join(values)}")
        return dict(value)


class RegistryConfig(_Model):
    """The live registry's background work: probes and ``subscriptions/listen`` streams.

    On by default. With ``enabled = false`` the registry routes still answer (from the
    config alone, health ``unknown``) but nothing is probed and no listen stream is held.
    """

    enabled: bool = Field(True, description="Probe the upstreams and hold listen streams to them.")

    probe_min_interval_s: float = Field(
        DEFAULT_PROBE_MIN_INTERVAL_S,
        gt=0,
        description="Floor on the time between two probes of a healthy upstream, in seconds "
        "(the upstream's server/discover ttlMs is clamped to [min, max], then jittered).",
    )
    probe_max_interval_s: float = Field(
        DEFAULT_PROBE_MAX_INTERVAL_S,
        gt=0,
        description="Ceiling on the time between two probes of a healthy upstream, in seconds.",
    )
    probe_timeout_s: float = Field(
        DEFAULT_PROBE_TIMEOUT_S,
        gt=0,
        description="Whole probe (server/discover, or the legacy initialize handshake), in seconds.",
    )
    backoff_base_s: float = Field(
        DEFAULT_BACKOFF_BASE_S,
        gt=0,
        description="First retry delay after a failed probe or a lost listen stream, in seconds "
        "(doubles per failure, with jitter).",
    )
    backoff_max_s: float = Field(
        DEFAULT_BACKOFF_MAX_S, gt=0, description="Ceiling on the retry delay after failures, in seconds."
    )
    listen: bool = Field(
        True,
        description="Hold a subscriptions/listen stream to each modern upstream that advertises listChanged "
        "or resources.subscribe, and purge its cache entries on its notifications.",
    )
    server_namespace: str = Field(
        DEFAULT_SERVER_NAMESPACE,
        pattern=r"^[a-zA-Z0-9.-]+$",
        max_length=100,
        description="Reverse-DNS namespace of the names in /v0.1/servers ('<namespace>/<upstream name>').",
    )
    public_base_url: HttpUrl | None = Field(
        None,
        description="Base URL clients use to reach the gateway, for the remotes in /v0.1/servers "
        "(default: the scheme and Host of each registry request).",
    )

    @model_validator(mode="after")
    def _ordered_bounds(self) -> RegistryConfig:
        if self.probe_min_interval_s > self.probe_max_interval_s:
            raise ValueError("probe_min_interval_s must not exceed probe_max_interval_s")
        if self.backoff_base_s > self.backoff_max_s:
            raise ValueError("backoff_base_s must not exceed backoff_max_s")
        return self


class ClusterConfig(_Model):
    """Shared state on Redis: every replica and worker naming the same ``redis_url`` and
    ``key_prefix`` is one gateway (docs/replicas.md)."""

    # The URL may hold a password and ``secret`` is one: no error message quotes what was given.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    redis_url: str = Field(
        description="redis://[user:password@]host[:port][/db] or rediss:// for TLS; put a password "
        "in as ${ENV} (percent-encoded where it holds / @ : # ? or %). rediss:// takes the query "
        "keys ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs, ssl_check_hostname."
    )
    key_prefix: str = Field(
        DEFAULT_KEY_PREFIX,
        description="Every Redis key and channel of this gateway starts with it: 1 to 63 letters, "
        "digits, '.', '_' or '-', starting with a letter or digit.",
    )
    timeout_s: float = Field(
        DEFAULT_REDIS_TIMEOUT_S,
        gt=0,
        le=5,
        description="Bound on each Redis call (connect included), in seconds: past it the call is "
        "given up and the caller served without Redis.",
    )

    secret: str | None = Field(
        None,
        repr=False,
        validate_default=True,
        description="Key of the HMAC-SHA256 on every value written to Redis, and of the digests "
        f"naming each upstream's configuration there: at least {MIN_CLUSTER_SECRET_BYTES} bytes, "
        'given as "${ENV}"; the same on every replica. Required unless redis_url\'s host is on '
        "loopback (127.0.0.0/8, ::1, localhost); without it a fixed key is used, which does not "
        "protect against anyone who can write to that Redis.",
    )

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None, info: ValidationInfo) -> str | None:
        url = info.data.get("redis_url")
        if value is None:
            if isinstance(url, str) and not _on_loopback(url):
                raise ValueError(
                    "required when redis_url's host is not on loopback (127.0.0.0/8, ::1, localhost): "
                    'set secret = "${ENV_NAME}" to a random value of at least '
                    f"{MIN_CLUSTER_SECRET_BYTES} bytes, the same on every replica"
                )
            return None
        if len(value.encode()) < MIN_CLUSTER_SECRET_BYTES:
            raise ValueError(f"must be at least {MIN_CLUSTER_SECRET_BYTES} bytes long")
        return value

    @field_validator("key_prefix")
    @classmethod
    def _key_prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", value):
            raise ValueError("must be 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        try:
            url = urlsplit(value)
            port = url.port
        except ValueError:
            # Not the parser's message: it may quote part of a password.
            raise ValueError(f"not a Redis URL (a port that is not a number from 1 to 65535? {_ENCODE_HINT})") from None
        if url.scheme not in ("redis", "rediss"):
            raise ValueError("must start with redis:// or rediss://")
        if not url.hostname:
            raise ValueError("names no host")
        if port == 0:
            raise ValueError("port 0 is not a Redis port")
        db = url.path.lstrip("/")
        if db and (not db.isdigit() or int(db) > 2**31 - 1):
            raise ValueError(f"the database (after the last '/') is not a number from 0 ({_ENCODE_HINT})")
        if url.fragment:
            raise ValueError(f"has a '#' fragment ({_ENCODE_HINT})")
        keys = {k for k, _ in parse_qsl(url.query, keep_blank_values=True)}
        allowed = _TLS_QUERY_KEYS if url.scheme == "rediss" else frozenset()
        if keys - allowed:
            raise ValueError(
                f"takes no query keys {', '.join(sorted(keys - allowed))} (timeouts are [cluster] keys; rediss:// "
                f"takes {', '.join(sorted(_TLS_QUERY_KEYS))}; {_ENCODE_HINT})"
            )
        return value


def _on_loopback(url: str) -> bool:
    """Whether the host of a Redis URL (already validated) is a loopback address or ``localhost``."""
    return loopback_host(urlsplit(url).hostname or "")


_ENCODE_HINT: Final = "percent-encode / @ : # ? and % in a password"
_TLS_QUERY_KEYS: Final = frozenset(
    {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"}
)


class AggregateConfig(_Model):
    """``POST /mcp``: the members' tools, prompts and resources as one MCP server
    (docs/aggregate.md)."""

    upstreams: tuple[str, ...] | None = Field(
        None,
        description="The members, by upstream name, in the order their items are listed (default: every upstream).",
    )
    separator: str = Field(
        "__",
        min_length=1,
        max_length=8,
        description="Exposed tool and prompt names are <member><separator><name>.",
    )
    page_size: int = Field(100, ge=1, le=10_000, description="Items a page of an aggregate list.")
    max_member_pages: int = Field(
        20, ge=1, le=1000, description="Pages of one member followed for one list; past it the rest is left out."
    )
    max_listen_streams: int = Field(
        1024, ge=1, description="Clients' subscriptions/listen streams open on /mcp at once."
    )

    @field_validator("separator")
    @classmethod
    def _separator(cls, value: str) -> str:
        if not all("!" <= ch <= "~" for ch in value) or "/" in value:
            raise ValueError("must be visible ASCII without '/'")
        return value


class GatewayConfig(_Model):
    """The whole config file (docs/configuration.md)."""

    listener: ListenerConfig = ListenerConfig()
    cache: CacheConfig = CacheConfig()
    auth: AuthConfig | None = None
    admin: AdminConfig | None = None
    registry: RegistryConfig = Field(
        RegistryConfig(), description="Live registry: discovery probes and listen streams (on by default)."
    )
    cluster: ClusterConfig | None = Field(
        None, description="Shared cache, single flight, invalidation and probing on Redis (default: none)."
    )
    upstreams: Mapping[Annotated[str, Field(pattern=UPSTREAM_NAME_PATTERN)], UpstreamConfig] = Field(
        default_factory=dict, description="The upstreams, by name."
    )
    aggregate: AggregateConfig | None = Field(
        None, description="POST /mcp, the members as one MCP server (default: no /mcp)."
    )
    policy: PolicyConfig = Field(PolicyConfig(), description="Per-caller rules (docs/policy.md; default: none).")

    @field_validator("aggregate")
    @classmethod
    def _members(cls, value: AggregateConfig | None, info: ValidationInfo) -> AggregateConfig | None:
        # Checked as the aggregate's own errors (after the upstreams, which come first), so that
        # check-config names [aggregate] and its line.
        upstreams = info.data.get("upstreams")
        if value is None or upstreams is None:  # no [aggregate], or the upstreams were wrong
            return value
        members = value.upstreams if value.upstreams is not None else tuple(upstreams)
        if not members:
            raise located_error(
                "upstreams: names no member (leave the key out for every upstream)"
                if value.upstreams is not None
                else "there are no upstreams to aggregate"
            )
        for name in members:
            if name not in upstreams:
                close = difflib.get_close_matches(name, list(upstreams), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise located_error(
                    f"upstreams: no upstream named {name!r} ({hint}the upstreams are {', '.join(upstreams)})"
                )
            if members.count(name) > 1:
                raise located_error(f"upstreams: {name!r} is listed twice")
        if AGGREGATE_SERVER_NAME in upstreams:
            # /v0.1/servers lists POST /mcp as '<server_namespace>/aggregate' (gateway.registry.views).
            namespace = getattr(info.data.get("registry"), "server_namespace", "")
            raise located_error(
                f"with [aggregate] no upstream may be named {AGGREGATE_SERVER_NAME!r} (/v0.1/servers lists "
                f"POST /mcp as '{namespace}/{AGGREGATE_SERVER_NAME}'); rename the upstream"
            )
        sep = value.separator
        for one in members:
            for other in members:
                # one + sep a prefix of other + sep: "<other><sep>x" reads as a name of either.
                if other != one and (other + sep).startswith(one + sep):
                    exposed = f"{other}{sep}x"
                    raise located_error(
                        f"separator: members {one!r} and {other!r} with separator {sep!r} make names like "
                        f"{exposed!r} ambiguous (tool {exposed[len(one + sep) :]!r} of {one!r}, or 'x' of {other!r}): "
                        "choose a separator that no member name continues another's with"
                    )
        return value

    def aggregate_members(self) -> tuple[str, ...]:
        """The upstreams ``POST /mcp`` is made of, in order (``()`` without ``[aggregate]``)."""
        if self.aggregate is None:
            return ()
        return self.aggregate.upstreams if self.aggregate.upstreams is not None else tuple(self.upstreams)

    @model_validator(mode="after")
    def _no_token_passthrough(self) -> GatewayConfig:
        # With gateway auth, the caller's Authorization carries the gateway's own token,
        # which must never reach an upstream (MCP 2026-07-28, basic/authorization, 'Token
        # Handling'; basic/authorization/security-considerations, 'Access Token Privilege
        # Restriction').
        if self.auth is not None:
            bad = sorted(n for n, u in self.upstreams.items() if u.forward_authorization)
            if bad:
                raise ValueError(
                    f"upstreams {', '.join(bad)}: forward_authorization cannot be used with [auth] "
                    "(the gateway's own token would be forwarded)"
                )
            base = self.registry.public_base_url
            self.auth.check_resource(None if base is None else str(base))
        return self

    @field_validator("policy")
    @classmethod
    def _policy_upstreams(cls, value: PolicyConfig, info: ValidationInfo) -> PolicyConfig:
        upstreams = info.data.get("upstreams")
        if upstreams is not None:  # else the upstreams were wrong, and say so
            check_rule_upstreams(value, upstreams)
        if "auth" in info.data:  # else [auth] was wrong, and says so
            check_rule_callers(value, info.data["auth"])
        return value

    def vary_on_capabilities(self, upstream: str) -> bool:
        """Whether cache keys for ``upstream`` include the clientCapabilities hash."""
        override = self.upstreams[upstream].vary_on_client_capabilities
        return self.cache.vary_on_client_capabilities if override is None else override

    def stale_if_error_ms(self, upstream: str) -> int:
        """How long past expiry ``upstream``'s entries are kept to be served if it fails, in ms."""
        override = self.upstreams[upstream].stale_if_error_ms
        return self.cache.stale_if_error_ms if override is None else override

    def refresh_ahead(self, upstream: str) -> bool:
        """Whether ``upstream``'s entries in demand are fetched again before they expire."""
        override = self.upstreams[upstream].refresh_ahead
        return self.cache.refresh_ahead if override is None else override
