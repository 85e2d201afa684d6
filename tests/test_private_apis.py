"""The private parts of aiohttp and prometheus_client the gateway relies on, each named.

``pyproject.toml`` bounds both libraries from above; these tests are what an upgrade past the
bound must pass first: each one fails, naming the attribute, when the library changes shape.
"""

from __future__ import annotations

import inspect

from aiohttp import http_writer, web, web_protocol, web_server
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import values as client_values
from prometheus_client.utils import floatToGoString

from gateway.httpserver import _hook_is_as_expected
from gateway.proxy.hot import LEAN_RESPONSES, PIECES_WRITES


def test_aiohttp_response_has_the_attributes_lean_response_sets() -> None:
    """gateway.proxy.hot.LeanResponse sets web.Response's private attributes itself."""
    attributes = set(vars(web.Response(body=b"{}")))
    assert {
        "_state",
        "_headers",
        "_status",
        "_reason",
        "_body",
        "_compressed_body",
        "_zlib_executor_size",
        "_zlib_executor",
    } <= attributes
    assert LEAN_RESPONSES, "LeanResponse no longer builds what web.Response builds: hits take the slower path"


def test_aiohttp_stream_writer_has_the_parts_lean_pieces_response_reads() -> None:
    """gateway.proxy.hot.LeanPiecesResponse takes StreamWriter's buffered head and sends it with
    the pieces in one _writelines, where aiohttp's write_eof would join head and body."""
    writer = http_writer.StreamWriter(None, None)  # type: ignore[arg-type]
    assert writer._headers_buf is None and writer._headers_written is False
    assert writer.chunked is False and writer._compress is None
    assert writer._on_chunk_sent is None and writer.on_body_write is None
    assert list(inspect.signature(http_writer.StreamWriter._writelines).parameters) == ["self", "chunks"]
    assert "_send_headers_with_payload" in vars(http_writer.StreamWriter)  # what write_eof would do instead
    response = web.StreamResponse()
    assert response._payload_writer is None and response._eof_sent is False
    assert PIECES_WRITES, "LeanPiecesResponse no longer finds its parts: one-step hits join their body first"


def test_aiohttp_server_builds_handlers_by_the_module_name_request_handler() -> None:
    """gateway.httpserver replaces web_server.RequestHandler and overrides its handle_error."""
    assert web_server.RequestHandler is web_protocol.RequestHandler or _hook_is_as_expected(web_server)
    assert "RequestHandler" in vars(web_server.Server)["__call__"].__code__.co_names
    assert list(inspect.signature(web_protocol.RequestHandler.handle_error).parameters) == [
        "self",
        "request",
        "status",
        "exc",
        "message",
    ]
    assert _hook_is_as_expected(web_server)


def test_aiohttp_request_payload_error_is_in_web_protocol() -> None:
    """gateway.proxy.handler maps web_protocol.RequestPayloadError to a JSON-RPC parse error."""
    assert issubclass(web_protocol.RequestPayloadError, Exception)


def test_prometheus_histogram_child_has_buckets_and_sum_values() -> None:
    """gateway.telemetry.group adds n observations at once through a child's _buckets and _sum."""
    child = Histogram("h_seconds", "h", ["a"], buckets=(0.1, 1.0), registry=CollectorRegistry()).labels("x")
    child._buckets[0].inc(3)
    child._sum.inc(0.25)
    samples = {(s.name, s.labels.get("le")): s.value for s in next(iter(child.collect())).samples}
    assert samples[("h_seconds_bucket", "0.1")] == 3
    assert samples[("h_seconds_bucket", "+Inf")] == 3
    assert samples[("h_seconds_sum", None)] == 0.25


def test_prometheus_values_choose_the_value_class_as_the_gateway_does() -> None:
    """gateway.telemetry.group re-chooses values.ValueClass with get_value_class() and reads
    its _multiprocess flag (False outside multiprocess mode)."""
    assert callable(client_values.get_value_class)
    assert getattr(client_values.ValueClass, "_multiprocess", None) is not None
    assert floatToGoString(0.5) == "0.5"
