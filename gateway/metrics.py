"""Prometheus metrics of the gateway, created against an injected ``CollectorRegistry``.

Label values come only from configured upstream names, known MCP method names (else
``other``) and fixed outcome sets; never ids, tool names, URIs or tokens.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GatewayMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """Every metric the gateway exports (README "Metrics")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        ns = "mcp_gateway"
        self.requests = Counter(
            "requests",
            "Requests answered on MCP routes, by HTTP status.",
            ["upstream", "method", "status"],
            namespace=ns,
            registry=registry,
        )
        self.request_duration = Histogram(
            "request_duration_seconds",
            "Time to answer an MCP request (to the last byte), in seconds.",
            ["upstream", "method", "cache"],
            namespace=ns,
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.cache_lookups = Counter(
            "cache_lookups",
            "Cache lookups by result: hit, miss, coalesced, bypass.",
            ["upstream", "method", "result"],
            namespace=ns,
            registry=registry,
        )
        self.cache_stores = Counter(
            "cache_stores",
            "Upstream answers to cacheable requests: stored, or why not.",
            ["upstream", "method", "outcome"],
            namespace=ns,
            registry=registry,
        )
        self.cache_evictions = Counter(
            "cache_evictions",
            "Cache entries removed, by reason.",
            ["reason"],
            namespace=ns,
            registry=registry,
        )
        self.cache_entries = Gauge("cache_entries", "Entries in the cache.", namespace=ns, registry=registry)
        self.cache_bytes = Gauge("cache_bytes", "Bytes of results in the cache.", namespace=ns, registry=registry)
        self.upstream_request_duration = Histogram(
            "upstream_request_duration_seconds",
            "Time an upstream took to answer, in seconds.",
            ["upstream", "method"],
            namespace=ns,
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.upstream_up = Gauge(
            "upstream_up",
            "1 when the last probe of the upstream succeeded.",
            ["upstream"],
            namespace=ns,
            registry=registry,
        )
        self.upstream_supported_version = Gauge(
            "upstream_supported_version",
            "1 for each protocol version the upstream advertises.",
            ["upstream", "version"],
            namespace=ns,
            registry=registry,
        )
        self.inflight = Gauge(
            "inflight_requests",
            "Requests being forwarded to the upstream now.",
            ["upstream"],
            namespace=ns,
            registry=registry,
        )

    def evicted(self, reason: str, count: int) -> None:
        """Count ``count`` evictions for ``reason``."""
        self.cache_evictions.labels(reason).inc(count)
