"""The access log, the batched request metrics and the request journal that feeds both
(gateway.telemetry): what every request, cache hits included, writes to."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import logging
import math
import os
import socket
import threading
import time
import types
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry import (
    ACCESS_LOGGER,
    BATCH_DELAY_S,
    BATCH_RECORDS,
    AccessLogHandler,
    RequestJournal,
    RequestMetrics,
    RequestRecord,
    accesslog,
)

#: The access log's fields after asctime, level, name and message, in their documented order.
REQUEST_FIELDS = ("upstream", "method", "http_method", "status", "jsonrpc_error", "cache", "cache_status", "duration_ms")

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
    # JSON Lines: split on \n only (U+2028 may appear raw inside a line, as JSON allows).
    return [json.loads(line) for line in text.split("\n") if line]


def asctime_seconds(asctime: str) -> float:
    stamp = datetime.datetime.strptime(asctime, "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def test_a_request_line_is_the_json_of_its_fields() -> None:
    out = io.StringIO()
    handler = AccessLogHandler(out)
    odd = ('up"\\é\u2028\x01', "other", "GET", 502, -32603, "bypass", None, 1.5)
    before = time.time()
    handler.write_requests([record(), record(odd, None)])
    first, second = lines_of(out.getvalue())
    assert list(first)[:4] == ["asctime", "level", "name", "message"]
    assert list(first)[4:] == list(REQUEST_FIELDS)
    assert (first["level"], first["name"], first["message"]) == ("INFO", ACCESS_LOGGER, "request")
    assert before - 0.01 <= asctime_seconds(first["asctime"]) <= time.time()  # when the request ended
    assert {k: first[k] for k in REQUEST_FIELDS} == dict(zip(REQUEST_FIELDS, (*VALUES[:-1], 0.123), strict=True))
    assert {k: second[k] for k in REQUEST_FIELDS} == dict(zip(REQUEST_FIELDS, (*odd[:-1], 1500.0), strict=True))


def test_a_line_is_stamped_with_the_time_its_request_ended() -> None:
    out = io.StringIO()
    handler = AccessLogHandler(out)
    now = time.perf_counter()
    handler.write_requests([record(ended=now - 3.25), record(ended=now)])
    first, second = lines_of(out.getvalue())
    gap = asctime_seconds(second["asctime"]) - asctime_seconds(first["asctime"])
    assert gap == pytest.approx(3.25, abs=0.0015)


def _fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.time() == time.perf_counter() == 0 for the access log: a record's end is its wall time."""
    fixed = types.SimpleNamespace(
        time=lambda: 0.0, perf_counter=lambda: 0.0, localtime=time.localtime, strftime=time.strftime
    )
    monkeypatch.setattr(accesslog, "time", fixed)


def stamp_of(second: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))


@pytest.mark.parametrize(
    ("ended", "expected"),
    [
        (-0.5, (-1, "500")),
        (-1e-9, (-1, "999")),
        (-5e-324, (-1, "999")),  # rounds up to the next second: still that second's last ms
        (-5.3, (-6, "700")),
        (math.nextafter(1764475201.0, 0.0), (1764475200, "999")),  # the last float before a second
        (1764475201.0, (1764475201, "000")),
    ],
)
def test_times_before_1970_and_at_second_boundaries_are_floored(
    monkeypatch: pytest.MonkeyPatch, ended: float, expected: tuple[int, str]
) -> None:
    _fixed_clock(monkeypatch)
    out = io.StringIO()
    AccessLogHandler(out).write_requests([record(ended=ended)])
    (line,) = lines_of(out.getvalue())
    assert line["asctime"] == f"{stamp_of(expected[0])},{expected[1]}"


def test_a_time_with_no_local_time_is_dropped_and_leaves_the_stamp_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    _fixed_clock(monkeypatch)
    out = io.StringIO()
    handler = AccessLogHandler(out)
    t = 1764475200.0
    handler.write_requests([record(ended=t + 0.5), record(ended=1e17), record(ended=t + 0.6), record(ended=1e17)])
    handler.write_requests([record(ended=1e17), record(ended=t + 0.7)])
    assert [x["asctime"] for x in lines_of(out.getvalue())] == [
        f"{stamp_of(int(t))},{ms}" for ms in ("500", "599", "700")
    ]
    assert capsys.readouterr().err.count("access log line dropped") == 3


@pytest.mark.parametrize("seconds", [0.0, 0.0001234, 0.0004995, 0.9999996, 1.5, 12.3456789, 86400.0])
def test_durations_are_milliseconds_to_three_decimals(seconds: float) -> None:
    out = io.StringIO()
    AccessLogHandler(out).write_requests([record((*VALUES[:-1], seconds))])
    (line,) = lines_of(out.getvalue())
    assert line["duration_ms"] == pytest.approx(seconds * 1000, abs=0.0005)
    assert isinstance(line["duration_ms"], float)


def test_a_line_is_what_orjson_writes_for_its_fields() -> None:
    """Every field is written byte for byte as orjson.dumps of the same dict (escapes included)."""
    out = io.StringIO()
    handler = AccessLogHandler(out)
    values = ('up"\\é\u2028\x01', "tools/list", "POST", 200, -32602, "miss", "mcp-gateway; fwd=miss", 0.25)
    handler.write_requests([record(values)])
    text = out.getvalue().strip()
    line = json.loads(text)
    expected = orjson.dumps(
        {
            "asctime": line["asctime"],
            "level": "INFO",
            "name": ACCESS_LOGGER,
            "message": "request",
            **dict(zip(REQUEST_FIELDS, (*values[:-1], 250.0), strict=True)),
        }
    ).decode()
    assert text == expected


def test_a_line_that_cannot_be_formatted_is_dropped_and_the_rest_are_written(capsys: Any) -> None:
    out = io.StringIO()
    handler = AccessLogHandler(out)
    handler.write_requests([RECORD, ("too", "short"), RECORD])
    assert len(lines_of(out.getvalue())) == 2
    assert "access log line dropped" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_lines_to_a_pipe_or_socket_are_written_whole_in_atomic_writes(kind: str) -> None:
    """Several workers share one stderr: on a pipe, or a socket such as journald's, every
    write is at most PIPE_BUF bytes and ends at a line end, so their lines never interleave."""
    if kind == "pipe":
        read_fd, write_fd = os.pipe()
    else:
        left, right = socket.socketpair()
        read_fd, write_fd = left.detach(), right.detach()
    chunks: list[bytes] = []

    def drain() -> None:
        while data := os.read(read_fd, 1 << 20):
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    with os.fdopen(write_fd, "w") as stream:
        handler = AccessLogHandler(stream)
        writes: list[int] = []
        real_write = os.write

        def spy(fd: int, data: Any) -> int:
            writes.append(len(data))
            assert bytes(data).endswith(b"\n")
            return real_write(fd, data)

        os.write = spy  # type: ignore[assignment]
        try:
            long_line = RECORD._replace(upstream="x" * 6000)
            handler.write_requests([long_line if i == 7 else RECORD for i in range(40)])
        finally:
            os.write = real_write
    reader.join(5)
    os.close(read_fd)
    assert max(w for w in writes if w < 6000) <= 4096 and any(w > 6000 for w in writes)
    assert len(lines_of(b"".join(chunks).decode())) == 40


async def test_a_batch_to_a_regular_file_is_one_write(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    writes: list[int] = []
    real_write = os.write

    def spy(fd: int, data: Any) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    with path.open("w") as stream:
        handler = AccessLogHandler(stream)
        os.write = spy  # type: ignore[assignment]
        try:
            handler.write_requests([record(("y" * 300, *VALUES[1:])) for _ in range(30)])
        finally:
            os.write = real_write
    assert len(lines_of(path.read_text())) == 30
    assert writes == [path.stat().st_size]


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
    await asyncio.sleep(BATCH_DELAY_S + 0.2)  # ... and a partial one after BATCH_DELAY_S
    assert len(lines_of(out.getvalue())) == BATCH_RECORDS + 1
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


def test_request_metrics_match_prometheus_client_counter_and_histogram() -> None:
    """The batched collector exposes the same samples as Counter/Histogram would."""
    ours_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    ours = RequestMetrics("mcp_gateway", ours_registry, (0.001, 0.01, 0.1))
    requests = Counter(
        "requests",
        "Requests answered on MCP routes, by HTTP status.",
        ["upstream", "method", "status"],
        namespace="mcp_gateway",
        registry=reference_registry,
    )
    durations = Histogram(
        "request_duration_seconds",
        "Time to answer an MCP request (to the last byte), in seconds.",
        ["upstream", "method", "cache"],
        namespace="mcp_gateway",
        registry=reference_registry,
        buckets=(0.001, 0.01, 0.1),
    )
    observations = [("up", "tools/list", 200, "hit", "hit", s) for s in (0.0005, 0.001, 0.002, 0.01, 5.0)]
    observations += [("up", "tools/call", 502, "bypass", None, 0.3)] * 3
    records = []
    for upstream, method, status, cache, lookup, seconds in observations:
        records.append(record((upstream, method, "POST", status, None, cache, None, seconds), lookup))
        requests.labels(upstream, method, str(status)).inc()
        durations.labels(upstream, method, cache).observe(seconds)
    upstream_durations = Histogram(
        "upstream_request_duration_seconds",
        "Time an upstream took to answer, in seconds.",
        ["upstream", "method"],
        namespace="mcp_gateway",
        registry=reference_registry,
        buckets=(0.001, 0.01, 0.1),
    )
    for i, r in enumerate(records):
        if r.status == 502 or i % 2:  # forwarded
            records[i] = r._replace(upstream_seconds=r.seconds / 3)
            upstream_durations.labels(r.upstream, r.method).observe(r.seconds / 3)
    ours.add(records[:4])  # in two batches
    ours.add(records[4:])

    def samples(registry: CollectorRegistry, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith(prefix) and not s.name.endswith("_created")
        }

    prefixes = ("mcp_gateway_requests", "mcp_gateway_request_duration_seconds", "mcp_gateway_upstream_request")
    for prefix in prefixes:
        assert samples(ours_registry, prefix) == pytest.approx(samples(reference_registry, prefix))
    assert ours.requests("up", "tools/list", 200) == 5
    assert ours.lookups("up", "tools/list", "hit") == 5
    assert ours.lookups("up", "tools/call", "bypass") == 0  # the cache was not asked


def test_request_metrics_add_up_batches_of_many_kinds() -> None:
    """Many kinds of request in one batch, each summed apart."""
    registry = CollectorRegistry()
    ours = RequestMetrics("mcp_gateway", registry, (0.001, 0.01))
    reference = Histogram(
        "d", "d", ["upstream", "method", "cache"], registry=CollectorRegistry(), buckets=(0.001, 0.01)
    )
    records = [
        record((f"up{i % 11}", "tools/list", "POST", 200, None, "hit", None, i / 7000), "hit") for i in range(300)
    ]
    ours.add(records)
    for r in records:
        reference.labels(r.upstream, r.method, r.cache).observe(r.seconds)
    for i in range(11):
        series = ours._durations[(f"up{i}", "tools/list", "hit")]
        assert series[-1] == pytest.approx(reference.labels(f"up{i}", "tools/list", "hit")._sum.get())
        assert sum(series[:-1]) == len([r for r in records if r.upstream == f"up{i}"])
