"""The access log (gateway.telemetry.accesslog): one JSON line per request, stamped with the time
the request ended, written whole."""

from __future__ import annotations

import datetime
import io
import json
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
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.telemetry import ACCESS_LOGGER, AccessLogHandler, RequestRecord, accesslog

from ..support.telemetry import RECORD, REQUEST_FIELDS, VALUES, lines_of, record


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
    """Every field is written byte for byte as orjson.dumps of the same dict (escapes included),
    the duration in milliseconds with three decimals."""
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
            **dict(zip(REQUEST_FIELDS, (*values[:-1], orjson.Fragment(b"250.000")), strict=True)),
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


_texts = st.text(max_size=12)
_records = st.builds(
    RequestRecord,
    upstream=_texts,
    method=st.sampled_from(["tools/list", "tools/call", "other"]),
    http_method=st.sampled_from(["POST", "GET", "DELETE"]),
    status=st.sampled_from([200, 202, 400, 401, 404, 499, 502, 504]),
    jsonrpc_error=st.none() | st.integers(-(2**63), 2**63 - 1),
    cache=st.sampled_from(["hit", "miss", "bypass"]),
    cache_status=st.none() | _texts,
    seconds=st.floats(0, 1e6, allow_nan=False),
    lookup=st.none() | st.sampled_from(["hit", "miss", "coalesced", "bypass"]),
    ended=st.just(0.0),
    upstream_seconds=st.none() | st.floats(0, 100),
    subject=st.none() | _texts,
)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(_records, min_size=1, max_size=6), created=st.floats(1e9, 2e9))
@example(records=[RECORD], created=1764475200.0)  # the first millisecond of a second
@example(records=[RECORD], created=1764475200.9995)  # its last
@example(records=[RECORD], created=math.nextafter(1764475201.0, 0.0))  # rounds to 1000 ms: 999
def test_the_remembered_line_is_the_plain_line_byte_for_byte(records: list[RequestRecord], created: float) -> None:
    handler = AccessLogHandler(io.StringIO())
    for r in records + records:  # the second time from the remembered text
        assert handler.line(r, created) == handler.plain_line(r, created)
