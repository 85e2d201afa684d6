"""The gateway's configuration: the model of the config file (:mod:`.model`) and loading it
from TOML (:mod:`.load`)."""

from .load import ConfigError, LoadedConfig, load_config, parse_config, read_config, secret_files
from .model import (
    AGGREGATE_SERVER_NAME,
    UPSTREAM_NAME_PATTERN,
    AdminConfig,
    AggregateConfig,
    AuthConfig,
    CacheConfig,
    ClusterConfig,
    GatewayConfig,
    IntrospectionConfig,
    JwtConfig,
    ListenerConfig,
    RegistryConfig,
    ResourceConfig,
    StaticToken,
    UpstreamConfig,
)
from .policy import PolicyConfig, PolicyRule

__all__ = [
    "AGGREGATE_SERVER_NAME",
    "UPSTREAM_NAME_PATTERN",
    "AdminConfig",
    "AggregateConfig",
    "AuthConfig",
    "CacheConfig",
    "ClusterConfig",
    "ConfigError",
    "GatewayConfig",
    "IntrospectionConfig",
    "JwtConfig",
    "ListenerConfig",
    "LoadedConfig",
    "PolicyConfig",
    "PolicyRule",
    "RegistryConfig",
    "ResourceConfig",
    "StaticToken",
    "UpstreamConfig",
    "load_config",
    "parse_config",
    "read_config",
    "secret_files",
]
