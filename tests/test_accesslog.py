"""The access log (gateway.accesslog) and the batched request metrics (gateway.metrics):
the two things every request, cache hits included, writes to."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.accesslog import ACCESS_LOGGER, FLUSH_LINES, REQUEST_FIELDS, AccessLogHandler
from gateway.metrics import FOLD_EVERY, RequestMetrics

VALUES: tuple[Any, ...] = ("up", "tools/list", "POST", 200, None, "hit", "mcp-gateway; hit; ttl=59", 0.0001234)


def lines_of(text: str) -> list[dict[str, Any]]:
    # JSON Lines: split on \n only (U+2028 may appear raw inside a line, as JSON allows).
    return [json.loads(line) for line in text.split("\n") if line]


def test_a_request_line_is_the_json_of_its_fields() -> None:
    out = io.StringIO()
    handler = AccessLogHandler(out)
    created = time.time()
    odd = ('up"\\é\u2028\x01', "other", "GET", 502, -32603, "bypass", None, 1.5)
    handler.write_request(created, VALUES)  # outside an event loop: written at once
    handler.write_request(created, odd)
    first, second = lines_of(out.getvalue())
    assert list(first)[:4] == ["asctime", "level", "name", "message"]
    assert (first["level"], first["name"], first["message"]) == ("INFO", ACCESS_LOGGER, "request")
    assert first["asctime"] == handler._asctime(created)
    assert {k: first[k] for k in REQUEST_FIELDS} == dict(zip(REQUEST_FIELDS, (*VALUES[:-1], 0.123), strict=True))
    assert {k: second[k] for k in REQUEST_FIELDS} == dict(zip(REQUEST_FIELDS, (*odd[:-1], 1500.0), strict=True))


async def test_lines_are_written_in_batches_not_per_request() -> None:
    out = io.StringIO()
    handler = AccessLogHandler(out)
    for _ in range(FLUSH_LINES - 1):
        handler.write_request(time.time(), VALUES)
    assert out.getvalue() == ""  # queued: the batch is neither full nor due
    handler.write_request(time.time(), VALUES)
    assert len(lines_of(out.getvalue())) == FLUSH_LINES  # a full batch goes at once
    handler.write_request(time.time(), VALUES)
    await asyncio.sleep(0.2)  # ... and a partial one after FLUSH_DELAY_S (50 ms)
    assert len(lines_of(out.getvalue())) == FLUSH_LINES + 1
    handler.write({"note": "direct"})
    handler.close()  # close (logging.shutdown at exit) writes what is queued
    assert lines_of(out.getvalue())[-1]["note"] == "direct"


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
            long_line = ("x" * 6000, *VALUES[1:])
            for i in range(40):
                handler.write_request(time.time(), long_line if i == 7 else VALUES)
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
            for _ in range(30):
                handler.write({"padding": "y" * 300})
            handler.flush()
        finally:
            os.write = real_write
    assert len(lines_of(path.read_text())) == 30
    assert writes == [path.stat().st_size]


def test_values_of_unexpected_types_still_make_a_valid_line() -> None:
    out = io.StringIO()
    handler = AccessLogHandler(out)
    handler.write_request(time.time(), ("up", "tools/call", "POST", 200, True, "bypass", None, 0.5))
    handler.write_request(time.time(), ("up", "tools/call", "POST", 200, 2**70, "bypass", None, 1))
    first, second = lines_of(out.getvalue())
    assert (first["jsonrpc_error"], first["duration_ms"]) == (True, 500.0)
    assert (second["jsonrpc_error"], second["duration_ms"]) == (2**70, 1000)


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
    for upstream, method, status, cache, lookup, seconds in observations:
        ours.record(upstream, method, status, cache, lookup, seconds)
        requests.labels(upstream, method, str(status)).inc()
        durations.labels(upstream, method, cache).observe(seconds)

    def samples(registry: CollectorRegistry, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith(prefix) and not s.name.endswith("_created")
        }

    for prefix in ("mcp_gateway_requests", "mcp_gateway_request_duration_seconds"):
        assert samples(ours_registry, prefix) == pytest.approx(samples(reference_registry, prefix))
    assert ours.requests("up", "tools/list", 200) == 5
    assert ours.lookups("up", "tools/list", "hit") == 5
    assert ours.lookups("up", "tools/call", "bypass") == 0  # the cache was not asked


def test_request_metrics_fold_in_batches_and_before_every_scrape() -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics("mcp_gateway", registry, (0.01,))
    for _ in range(FOLD_EVERY - 1):
        metrics.record("up", "ping", 200, "bypass", None, 0.001)
    assert metrics._requests == {}  # recorded, not yet added up
    metrics.record("up", "ping", 200, "bypass", None, 0.001)
    assert metrics._requests == {("up", "ping", "200"): FOLD_EVERY}
    metrics.record("up", "ping", 200, "bypass", None, 0.001)
    text = generate_latest(registry).decode()  # a scrape sees every recorded request
    assert f'mcp_gateway_requests_total{{method="ping",status="200",upstream="up"}} {FOLD_EVERY + 1}.0' in text


def test_the_format_is_stable_against_orjson() -> None:
    """The template writes exactly what orjson.dumps of the same dict writes."""
    handler = AccessLogHandler(io.StringIO())
    created = 1_790_000_000.25
    line = handler._format((created, VALUES))
    expected = orjson.dumps(
        {
            "asctime": handler._asctime(created),
            "level": "INFO",
            "name": ACCESS_LOGGER,
            "message": "request",
            **dict(zip(REQUEST_FIELDS, (*VALUES[:-1], 0.123), strict=True)),
        }
    )
    assert line == expected
