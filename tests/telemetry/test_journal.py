"""The request journal (gateway.telemetry.journal): it collects every request's record, cache hits
included, and hands batches to the metrics and the access log."""

from __future__ import annotations

import asyncio
import io
import logging
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.telemetry import BATCH_DELAY_S, BATCH_RECORDS, AccessLogHandler, RequestJournal, RequestMetrics

from ..support.polling import wait_until
from ..support.telemetry import RECORD, REQUEST_FIELDS, VALUES, lines_of, record


def journal_with(handler: logging.Handler, name: str) -> tuple[RequestJournal, RequestMetrics, CollectorRegistry]:
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    registry = CollectorRegistry()
    metrics = RequestMetrics("mcp_gateway", registry, (0.01,))
    return RequestJournal(metrics, logger), metrics, registry


async def test_the_journal_hands_on_full_batches_at_once_and_others_within_the_delay() -> None:
    out = io.StringIO()
    journal, metrics, _ = journal_with(AccessLogHandler(out), "test.journal.batches")
    for _ in range(BATCH_RECORDS - 1):
        journal.add(RECORD)
    assert out.getvalue() == ""  # recorded: the batch is neither full nor due
    assert metrics._requests == {}
    journal.add(RECORD)
    assert len(lines_of(out.getvalue())) == BATCH_RECORDS  # a full batch goes at once
    assert metrics._requests == {("up", "tools/list", "200"): BATCH_RECORDS}
    journal.add(RECORD)
    assert len(lines_of(out.getvalue())) == BATCH_RECORDS  # ... a partial one is not due yet
    # ... and goes within BATCH_DELAY_S, on the journal's own timer (polled, with a bound)
    await wait_until(
        lambda: len(lines_of(out.getvalue())) == BATCH_RECORDS + 1, limit_s=BATCH_DELAY_S + 5, what="the partial batch"
    )
    assert metrics._requests == {("up", "tools/list", "200"): BATCH_RECORDS + 1}


def test_a_scrape_sees_every_request_recorded_before_it() -> None:
    out = io.StringIO()
    journal, _, registry = journal_with(AccessLogHandler(out), "test.journal.scrape")
    journal._scheduled = asyncio.get_event_loop_policy().new_event_loop().call_later(3600, lambda: None)
    journal.add(record(("up", "ping", "POST", 200, None, "bypass", None, 0.001), None))
    journal.add(record(("up", "ping", "POST", 200, None, "bypass", None, 0.001), None))
    assert out.getvalue() == ""
    text = generate_latest(registry).decode()
    assert 'mcp_gateway_requests_total{method="ping",status="200",upstream="up"} 2.0' in text
    assert len(lines_of(out.getvalue())) == 2  # the access log got the batch too


def test_without_the_batching_handler_the_journal_logs_through_logging() -> None:
    """Other handlers on the access logger get ordinary records, one per request, with the
    request's fields and the time it ended."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, log_record: logging.LogRecord) -> None:
            seen.append(log_record)

    journal, _, _ = journal_with(Keep(), "test.journal.logging")
    ended = time.perf_counter() - 2.0
    journal.add(record(ended=ended))
    journal.drain()
    (log_record,) = seen
    assert log_record.getMessage() == "request" and log_record.levelno == logging.INFO
    assert {k: getattr(log_record, k) for k in REQUEST_FIELDS} == dict(
        zip(REQUEST_FIELDS, (*VALUES[:-1], 0.123), strict=True)
    )
    assert log_record.created == pytest.approx(time.time() - 2.0, abs=0.05)


def test_with_the_access_log_off_only_the_metrics_are_kept() -> None:
    out = io.StringIO()
    journal, metrics, _ = journal_with(AccessLogHandler(out), "test.journal.off")
    logging.getLogger("test.journal.off").setLevel(logging.WARNING)
    journal.add(RECORD)
    journal.drain()
    assert out.getvalue() == ""
    assert metrics.requests("up", "tools/list", 200) == 1
