"""What the gateway tells operators: request records, the journal that batches them, the
Prometheus metrics and the access log.

Modules, lower first: ``record`` (one request's record), ``metrics`` (every metric, the
per-request families added up in batches), ``accesslog`` (JSON lines), ``journal`` (collects
records, hands them to the metrics and the access log), ``serverlog`` (aiohttp's own errors,
short and rate-bounded).
"""

from .accesslog import ACCESS_LOGGER, AccessLogHandler, direct_handler, request_fields
from .group import GAUGE_SAMPLE_S, MULTIPROC_DIR_ENV, MultiProcessRegistry
from .journal import BATCH_DELAY_S, BATCH_RECORDS, RequestJournal
from .metrics import GatewayMetrics, RequestMetrics
from .record import RequestRecord
from .serverlog import ServerErrorFilter, quiet_server_errors

__all__ = [
    "ACCESS_LOGGER",
    "BATCH_DELAY_S",
    "BATCH_RECORDS",
    "GAUGE_SAMPLE_S",
    "MULTIPROC_DIR_ENV",
    "AccessLogHandler",
    "GatewayMetrics",
    "MultiProcessRegistry",
    "RequestJournal",
    "RequestMetrics",
    "RequestRecord",
    "ServerErrorFilter",
    "direct_handler",
    "quiet_server_errors",
    "request_fields",
]
