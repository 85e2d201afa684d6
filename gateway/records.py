"""The request record: one plain tuple per finished MCP request.

The proxy builds one when a request ends, gateway.journal collects them, and the metrics
(gateway.metrics) and the access log (gateway.accesslog) read them in batches. A tuple, not
an object: every request, cache hits included, builds one. Its items, by index:
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CACHE",
    "CACHE_STATUS",
    "ENDED",
    "HTTP_METHOD",
    "JSONRPC_ERROR",
    "LOOKUP",
    "METHOD",
    "REQUEST_FIELDS",
    "SECONDS",
    "STATUS",
    "UPSTREAM",
    "UPSTREAM_SECONDS",
    "RequestRecord",
]

UPSTREAM: Final = 0  #: configured upstream name, or ``unknown``
METHOD: Final = 1  #: MCP method label (gateway.protocol.method_label)
HTTP_METHOD: Final = 2  #: POST, GET, DELETE
STATUS: Final = 3  #: HTTP status answered (499: the caller went away)
JSONRPC_ERROR: Final = 4  #: JSON-RPC error code answered, or ``None``
CACHE: Final = 5  #: hit, miss, bypass
CACHE_STATUS: Final = 6  #: the ``Cache-Status`` value, or ``None``
SECONDS: Final = 7  #: time to answer, seconds
LOOKUP: Final = 8  #: cache lookup result (hit, miss, coalesced, bypass), ``None`` if not asked
ENDED: Final = 9  #: ``time.perf_counter()`` when the request ended
UPSTREAM_SECONDS: Final = 10  #: time the upstream took, seconds, ``None`` if not asked

#: The access log's field names of items 0 to 7 (``duration_ms`` is written from seconds).
REQUEST_FIELDS: Final = (
    "upstream",
    "method",
    "http_method",
    "status",
    "jsonrpc_error",
    "cache",
    "cache_status",
    "duration_ms",
)

RequestRecord = tuple[str, str, str, int, "int | None", str, "str | None", float, "str | None", float, "float | None"]
