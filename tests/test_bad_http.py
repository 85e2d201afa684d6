"""Requests aiohttp's HTTP parser cannot parse, through ``mcp-gateway serve``: a hostile caller
must get a clear error that echoes none of its bytes, and cannot grow the logs without bound.

aiohttp answers them itself, before any route: a plain-text 400 that quotes the offending bytes
back (``Authorization`` included), and it logs them. The gateway answers each with a JSON-RPC
error instead (``gateway.httpserver``), quotes nothing of the request, logs nothing of it, and
logs a flood of them in a bounded number of lines. These run the real command in a process of its
own, over a real socket: the in-process ``TestServer`` of the other tests is not where ``serve``
installs its request handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web_protocol, web_server
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong, TransferEncodingError

from gateway import httpserver

from .support.fleet import HOST, free_port, healthy

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent
MARKER = b"SECRET-MARKER-123"
AUTH = b"Authorization: Bearer " + MARKER
POST = b"POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH + b"\r\nContent-Type: application/json\r\n"
MCP = b"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n"

#: One request of each kind aiohttp's parser refuses; the marker is in ``Authorization`` and,
#: where it can be, in the offending bytes themselves (which aiohttp quotes).
MALFORMED: dict[str, bytes] = {
    "bare-lf-line-ends": b"POST /servers/up/mcp HTTP/1.1\nHost: 127.0.0.1\n" + AUTH + b"\nContent-Length: 2\n\n{}",
    "cr-inside-a-header-value": POST + b"X-Note: a\r" + MARKER + b"\r\nContent-Length: 2\r\n\r\n{}",
    "two-host-headers": POST + b"Host: " + MARKER + b".example\r\nContent-Length: 2\r\n\r\n{}",
    "invalid-method": b"P(ST /servers/up/mcp?" + MARKER + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + AUTH + b"\r\n\r\n",
    "invalid-version": b"POST /servers/up/mcp?" + MARKER + b" HTTP/9.Z\r\nHost: 127.0.0.1\r\n" + AUTH + b"\r\n\r\n",
    "header-line-too-long": POST + b"X-Long: " + MARKER + b"a" * 20_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    "request-line-too-long": b"POST /servers/up/mcp?" + MARKER + b"a" * 20_000 + b" HTTP/1.1\r\n" + AUTH + b"\r\n\r\n",
    "too-many-headers": POST + b"".join(b"X-H%d: %s\r\n" % (i, MARKER) for i in range(200)) + b"\r\n",
    "nul-in-a-header-value": POST + b"X-Note: a\x00" + MARKER + b"\r\nContent-Length: 2\r\n\r\n{}",
    "bad-chunk-size": POST + MCP + b"Transfer-Encoding: chunked\r\n\r\nZZ;" + MARKER + b"\r\n{}\r\n0\r\n\r\n",
    "chunk-without-its-crlf": POST + MCP + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}" + MARKER + b"\r\n0\r\n\r\n",
    "chunked-and-content-length": POST + MCP + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
}


@dataclass
class Gateway:
    port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[Gateway]:
    """``mcp-gateway serve`` (text logs, level info) on a free port until it answers ``/healthz``;
    its stdout and stderr go to a file; SIGTERM at the end."""
    port = free_port()
    config = directory / "gateway.toml"
    config.write_text(
        f'[listener]\nport = {port}\n[registry]\nenabled = false\n[upstreams.up]\nurl = "http://{HOST}:9/mcp"\n'
    )
    log = directory / "gateway.log"
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--log-format", "text"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not healthy(port):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        yield Gateway(port, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with serving(tmp_path_factory.mktemp("bad-http")) as gw:
        yield gw


async def exchange(port: int, raw: bytes, *, read_s: float = 5.0) -> bytes:
    """Send ``raw`` to 127.0.0.1:``port``; everything that comes back until the server closes
    (it closes after refusing a request) or ``read_s`` passes."""
    reader, writer = await asyncio.open_connection(HOST, port)
    answer = b""
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(read_s):
            while chunk := await reader.read(65536):
                answer += chunk
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return answer


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split(" ", 2)[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


def assert_json_rpc_refusal(raw: bytes) -> None:
    assert MARKER not in raw, raw[:600]
    status, headers, body = parse_answer(raw)
    assert 400 <= status < 500, raw[:600]
    assert headers["content-type"].split(";")[0] == "application/json", headers
    assert set(body) == {"jsonrpc", "id", "error"} and body["jsonrpc"] == "2.0" and body["id"] is None, body
    assert body["error"]["code"] in (-32700, -32600), body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body


@pytest.mark.parametrize("kind", list(MALFORMED))
async def test_a_request_the_parser_refuses_is_a_json_rpc_4xx_that_quotes_nothing_of_it(
    gateway: Gateway, kind: str
) -> None:
    assert_json_rpc_refusal(await exchange(gateway.port, MALFORMED[kind]))
    # Nothing to wait for: the gateway writes its line (if any: a bad method is logged at DEBUG,
    # and past 10 lines in 10 s they are dropped) to the file before it answers, and `exchange`
    # returns only once the gateway has closed the connection, after which it logs nothing of it.
    text = gateway.log_text()
    assert MARKER.decode() not in text
    assert "Traceback" not in text
    # and the gateway still serves a good request
    good = await exchange(gateway.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert parse_answer(good)[0] == 200


def test_a_flood_of_malformed_requests_is_answered_and_logged_in_a_bounded_number_of_lines(tmp_path: Path) -> None:
    kinds = list(MALFORMED.values())

    async def flood(port: int) -> list[bytes]:
        return [await exchange(port, kinds[i % len(kinds)]) for i in range(300)]

    with serving(tmp_path) as gw:
        before = len(gw.log_text().splitlines())
        answers = asyncio.run(flood(gw.port))
        assert healthy(gw.port)
        text = gw.log_text()  # complete: each line was written before its connection closed (see the test above)
    for raw in answers:
        assert_json_rpc_refusal(raw)
    assert MARKER.decode() not in text
    assert "Traceback" not in text
    added = text.splitlines()[before:]
    assert 1 <= len(added) <= 25, added[:40]  # 300 malformed requests
    assert all(" ERROR " not in line for line in added), added[:5]


# -- the hook itself -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (BadHttpMessage("Too many headers: " + MARKER.decode()), -32600),
        (LineTooLong(MARKER.decode(), "8190"), -32600),
        (TransferEncodingError("bad chunk " + MARKER.decode()), -32700),
    ],
)
def test_the_answer_names_the_kind_of_error_and_none_of_its_text(exc: Exception, code: int) -> None:
    resp = httpserver.json_error_response(400, exc)
    assert resp.status == 400 and resp.content_type == "application/json"
    assert isinstance(resp.body, bytes) and MARKER not in resp.body
    body = json.loads(resp.body)
    assert body["id"] is None and body["error"]["code"] == code


def test_an_error_in_a_handler_is_a_json_rpc_internal_error() -> None:
    resp = httpserver.json_error_response(500, RuntimeError(MARKER.decode()))
    assert resp.status == 500 and isinstance(resp.body, bytes) and MARKER not in resp.body
    assert json.loads(resp.body)["error"]["code"] == -32603


def test_the_hook_recognises_this_aiohttp() -> None:
    copy = types.SimpleNamespace(Server=web_server.Server, RequestHandler=web_protocol.RequestHandler)
    assert httpserver.install_json_errors(copy) is True
    assert copy.RequestHandler is httpserver.JsonErrorRequestHandler
    assert httpserver.install_json_errors(copy) is True  # idempotent


def test_an_aiohttp_without_the_expected_hook_keeps_its_own_answers_and_says_so_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpserver, "_warned", False)

    class Server:
        def __call__(self) -> object:  # builds its handlers some other way
            return object()

    unexpected = types.SimpleNamespace(Server=Server, RequestHandler=object)
    with caplog.at_level(logging.WARNING, logger="mcp_gateway"):
        assert httpserver.install_json_errors(unexpected) is False
        assert httpserver.install_json_errors(unexpected) is False
    assert unexpected.RequestHandler is object
    assert len([r for r in caplog.records if "aiohttp" in r.getMessage()]) == 1
