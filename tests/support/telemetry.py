"""Request records for the telemetry tests (tests/telemetry/), reading the access log back, and
the cache-size gauges as a scrape gives them."""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.telemetry import RequestRecord

#: The access log's fields after asctime, level, name and message, in their documented order.
REQUEST_FIELDS = (
    "upstream",
    "method",
    "http_method",
    "status",
    "jsonrpc_error",
    "cache",
    "cache_status",
    "duration_ms",
)

VALUES: tuple[Any, ...] = ("up", "tools/list", "POST", 200, None, "hit", "mcp-gateway; hit; ttl=59", 0.0001234)


def record(
    values: tuple[Any, ...] = VALUES,
    lookup: str | None = "hit",
    ended: float | None = None,
    upstream_seconds: float | None = None,
) -> RequestRecord:
    """A request record from REQUEST_FIELDS values (duration in seconds), lookup, perf_counter
    end, upstream seconds."""
    return RequestRecord(*values, lookup, time.perf_counter() if ended is None else ended, upstream_seconds)


RECORD = record()


def lines_of(text: str) -> list[dict[str, Any]]:
    """The access log's lines, read as JSON."""
    # JSON Lines: split on \n only (U+2028 may appear raw inside a line, as JSON allows).
    return [json.loads(line) for line in text.split("\n") if line]


def cache_sizes(registry: CollectorRegistry) -> tuple[float | None, float | None]:
    """``(mcp_gateway_cache_entries, mcp_gateway_cache_bytes)`` as a scrape of ``registry`` reads them."""
    return registry.get_sample_value("mcp_gateway_cache_entries"), registry.get_sample_value("mcp_gateway_cache_bytes")
