"""Finished MCP requests: recorded with one tuple append, handed on in batches.

Every request on an MCP route ends with :meth:`RequestJournal.add`. The journal hands its
records, in batches, to the per-request metrics (:meth:`~gateway.telemetry.metrics.RequestMetrics.add`)
and, when the ``mcp_gateway.access`` logger is enabled for INFO, to the access log: every
``BATCH_RECORDS`` requests, ``BATCH_DELAY_S`` after the first request of a batch, and before
every ``/metrics`` scrape (so a scrape sees every request that ended before it). In a process
group (``serve --workers N``) a batch handed on is written to the group's metric files, so a
scrape answered by another worker sees a request at most ``BATCH_DELAY_S`` after it ended.

Why: updating three metric families and writing a log line per request cost a cache hit
more than everything else it does (bench/RESULTS.md); a batch is added up and formatted in a
few tight loops. Single-threaded: add from the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sys
import time
from operator import attrgetter
from typing import Final

from prometheus_client import Counter

from .accesslog import direct_handler, request_fields
from .metrics import RequestMetrics
from .record import RequestRecord

__all__ = ["BATCH_DELAY_S", "BATCH_RECORDS", "RequestJournal"]

#: Records are handed on this long (seconds) after the first of a batch ...
BATCH_DELAY_S: Final = 0.05
#: ... or at once when this many are waiting.
BATCH_RECORDS: Final = 256


_INFO: Final = logging.INFO
_AUTH: Final = attrgetter("auth")


class RequestJournal:
    """Collects request records and hands them on in batches (see the module)."""

    def __init__(self, metrics: RequestMetrics, logger: logging.Logger, auth: Counter | None = None) -> None:
        self._records: list[RequestRecord] = []
        self._metrics = metrics
        #: ``mcp_gateway_auth_total``, added up from the records' ``auth`` once a batch.
        self._auth = auth
        self._logger = logger
        self._scheduled: asyncio.TimerHandle | None = None
        metrics.before_collect = self.drain

    def add(self, record: RequestRecord) -> None:
        """Record one finished request (the hot path: an append and two checks)."""
        records = self._records
        records.append(record)
        if len(records) >= BATCH_RECORDS:
            self.drain()
        elif self._scheduled is None:
            try:
                self._scheduled = asyncio.get_running_loop().call_later(BATCH_DELAY_S, self.drain)
            except RuntimeError:  # no event loop (a synchronous caller): at once
                self.drain()

    def drain(self) -> None:
        """Hand every waiting record to the metrics and the access log now."""
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        batch, self._records = self._records, []
        if not batch:
            return
        self._metrics.add(batch)
        if self._auth is not None:
            for outcome, count in collections.Counter(map(_AUTH, batch)).items():
                if outcome is not None:
                    self._auth.labels(outcome).inc(count)
        logger = self._logger
        if not logger.isEnabledFor(_INFO):
            return
        handler = direct_handler(logger)
        if handler is not None:
            handler.write_requests(batch)
            return
        # Someone configured other handlers: the ordinary logging path, one record each,
        # stamped with the time its request ended.
        offset = time.time() - time.perf_counter()
        for record in batch:
            try:
                log_record = logger.makeRecord(
                    logger.name, _INFO, __file__, 0, "request", (), None, extra=request_fields(record)
                )
                created = record.ended + offset
                log_record.created = created
                log_record.msecs = (created - int(created)) * 1000
                logger.handle(log_record)
            except Exception:  # a log line is never worth a failed request
                with contextlib.suppress(Exception):
                    sys.stderr.write("mcp-gateway: access log write failed\n")
