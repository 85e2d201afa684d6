"""What one hostile caller can do to the gateway, and what it must not be able to.

Each test drives a defect that was reproduced against the gateway on 127.0.0.1 (a duplicate-key
parser differential, memory beyond ``cache.max_bytes``, stalled bodies held before the token
check, a non-reading leader holding back its followers, 500s on odd bytes, an open ``/metrics``,
two answers for one id, listen streams crowding out requests, invented versions in the registry)
and shows the gateway now holds. Every load is bounded in requests and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.app import STORE
from gateway.sse import SSEParser

from .support import (
    FakeUpstream,
    StartGateway,
    StartUpstream,
    V,
    list_result,
    mcp_headers,
    rpc,
    sse_frame,
    sse_messages,
)
from .support.fleet import free_port
from .support.polling import wait_until

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "caller-token-0123456789"
META = (
    '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}'
)


def gateway_config(fake: FakeUpstream, /, **sections: Any) -> dict[str, Any]:
    """A config with ``fake`` as upstream ``up``; ``upstream=`` adds to its table."""
    up = {"url": fake.url, **sections.pop("upstream", {})}
    return {"upstreams": {"up": up}, **sections}


async def raw_exchange(port: int, head: bytes, body: bytes = b"", *, read_s: float = 5.0) -> bytes:
    """Send raw bytes to 127.0.0.1:``port``; what comes back until one whole response has
    arrived, the server closes, or ``read_s`` passes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = b""
    try:
        writer.write(head + body)
        await writer.drain()
        async with asyncio.timeout(read_s):
            while not _complete(raw) and (chunk := await reader.read(65536)):
                raw += chunk
    except TimeoutError:
        pass
    finally:
        writer.close()
    return raw


def _complete(raw: bytes) -> bool:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def status_and_json(raw: bytes) -> tuple[int, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body) if body else None


def raw_tools_list(request_id: str) -> bytes:
    """A whole ``tools/list`` POST to upstream ``up``, as bytes for a raw socket."""
    body = json.dumps(rpc("tools/list", request_id)).encode()
    head = "POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in mcp_headers("tools/list").items()
    )
    return head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body


def large_answers(fake: FakeUpstream) -> dict[str, Any]:
    """A config that stores answers of tens of MiB, and drops a non-reading caller after 1 s."""
    return gateway_config(
        fake,
        cache={"max_entry_bytes": 64 << 20, "max_bytes": 256 << 20},
        listener={"write_timeout_s": 1.0},
        upstream={"max_response_bytes": 64 << 20},
    )


# -- 1. one request, one meaning -------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        # compact, as clients write: the fast check
        '{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"a","uri":"b",' + META + "}}",
        # spaced: the exact check
        '{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "a", "uri": "b", ' + META + "}}",
        '{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"prompts/list","params":{' + META + "}}",
        '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"x"},"params":{' + META + "}}",
        '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"x":1,"x":2}}}',
    ],
)
async def test_a_member_name_twice_in_one_object_is_refused_before_the_cache_and_the_upstream(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession, body: str
) -> None:
    upstream = await start_upstream()
    gw = await start_gateway(gateway_config(upstream))
    method = json.loads(body)["method"]  # json keeps the last: what the gateway would have read
    headers = mcp_headers(method, "b" if method == "resources/read" else None)
    async with http.post(gw.url("up"), data=body.encode(), headers=headers) as resp:
        answer = await resp.json()
        assert resp.status == 400, answer
    assert answer["error"]["code"] == -32600 and answer["id"] == 1
    assert upstream.requests == []
    assert len(gw.app[STORE]) == 0


async def test_a_repeated_id_is_not_echoed(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    gw = await start_gateway(gateway_config(upstream))
    body = '{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","params":{' + META + "}}"
    async with http.post(gw.url("up"), data=body.encode(), headers=mcp_headers("tools/list")) as resp:
        answer = await resp.json()
    assert resp.status == 400 and answer["error"]["code"] == -32600 and "id" not in answer


# -- 2, 3. memory bounded by the configured figures -------------------------------------------------


def retained_bytes() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def test_large_params_and_capabilities_are_forwarded_and_leave_no_memory_behind(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    """Keys once held whole params (a 4 MiB cursor per entry, uncounted by max_bytes) and a memo
    held every large clientCapabilities: 60 requests took 250 MiB of RSS."""
    upstream = await start_upstream()
    max_bytes = 1 << 20
    gw = await start_gateway(gateway_config(upstream, cache={"max_bytes": max_bytes}))
    big = 256 * 1024
    tracemalloc.start()
    try:
        before = retained_bytes()
        for i in range(40):
            cursor = f"{i:04d}" + "c" * big
            caps = {"experimental": {f"x{i}": "k" * big}}
            for msg in (rpc("tools/list", i, cursor=cursor), rpc("tools/list", i, caps=caps)):
                async with http.post(gw.url("up"), json=msg, headers=mcp_headers("tools/list")) as resp:
                    assert resp.status == 200
                    await resp.read()
            upstream.requests.clear()  # the fake upstream's own record of what it received
        grown = retained_bytes() - before
    finally:
        tracemalloc.stop()
    # 80 requests of 256 KiB each passed: 20 MiB if anything kept them.
    assert grown < 2 * max_bytes, grown
    assert gw.app[STORE].total_bytes <= max_bytes


# -- 4. a body that never finishes -----------------------------------------------------------------


async def test_stalled_bodies_are_answered_408_in_time_and_other_callers_are_served(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    gw = await start_gateway(gateway_config(upstream, listener={"body_timeout_s": 0.5}, auth={"tokens": [TOKEN]}))
    port = gw.server.port
    assert port is not None
    head = (
        b"POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n"
    )
    # Half with the token (408), half without (401: the token is checked before the body's fault is told).
    heads = [head + (f"Authorization: Bearer {TOKEN}\r\n".encode() if i % 2 else b"") + b"\r\n" for i in range(200)]
    started = time.monotonic()
    stalled = [asyncio.ensure_future(raw_exchange(port, h, b'{"jsonrpc":', read_s=8.0)) for h in heads]
    # Until the gateway has read all 200 heads: each a request begun, waiting on its stalled body.
    runner = gw.server.runner
    assert runner is not None and runner.server is not None
    server = runner.server  # aiohttp's web.Server: requests_count counts the requests it began
    await wait_until(lambda: server.requests_count >= len(heads), limit_s=5, what="the 200 stalled requests begun")
    headers = mcp_headers("tools/list", Authorization=f"Bearer {TOKEN}")
    async with http.post(gw.url("up"), json=rpc("tools/list"), headers=headers) as resp:
        assert resp.status == 200  # served while 200 bodies stall
    answers = await asyncio.gather(*stalled)
    assert time.monotonic() - started < 6.0
    for i, raw in enumerate(answers):
        status, body = status_and_json(raw)
        assert status == (408 if i % 2 else 401) and body["error"]["code"] == -32600
    assert upstream.requests and all(r.method == "tools/list" for r in upstream.requests)


# -- 5. a caller that stops reading ------------------------------------------------------------------


async def test_coalesced_followers_are_answered_while_the_leader_reads_nothing(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    size = 24 << 20  # more than the loopback socket buffers hold

    async def big_public_list(request: web.Request, msg: Any) -> web.StreamResponse:
        await asyncio.sleep(0.3)  # the followers arrive while it is on its way
        answer = list_result(msg["id"])
        answer["result"]["padding"] = "p" * size
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(sse_frame(answer))
        await out.write_eof()
        return out

    upstream = await start_upstream(big_public_list)
    gw = await start_gateway(large_answers(upstream))
    port = gw.server.port
    assert port is not None
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw_tools_list("leader"))  # and never read
    await writer.drain()
    await wait_until(lambda: upstream.requests, what="the leader's request upstream")  # it leads the key

    async def follower(i: int) -> str:
        async with http.post(gw.url("up"), json=rpc("tools/list", i), headers=mcp_headers("tools/list")) as resp:
            assert resp.status == 200
            raw = await resp.read()
            # From the cache (JSON), or, once the leader was dropped for not reading, its own
            # request upstream (the stream relayed).
            messages = sse_messages(raw) if resp.content_type == "text/event-stream" else [json.loads(raw)]
            assert [m["id"] for m in messages if "result" in m] == [i]
            return resp.headers["Cache-Status"]

    started = time.monotonic()
    statuses = await asyncio.wait_for(asyncio.gather(*(follower(i) for i in range(3))), 20)
    assert time.monotonic() - started < 15
    assert all(s.startswith("mcp-gateway") for s in statuses)
    assert upstream.count("tools/list") <= 4
    writer.close()


async def test_callers_that_read_nothing_of_a_large_hit_are_dropped_at_the_write_deadline(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    """40 non-reading callers of a large hit held 266 MiB for as long as they stayed connected."""
    size = 8 << 20

    async def large_public_list(request: web.Request, msg: Any) -> web.StreamResponse:
        answer = list_result(msg["id"])
        answer["result"]["padding"] = "p" * size
        return web.json_response(answer)

    upstream = await start_upstream(large_public_list)
    gw = await start_gateway(large_answers(upstream))
    async with http.post(gw.url("up"), json=rpc("tools/list"), headers=mcp_headers("tools/list")) as resp:
        assert resp.status == 200 and len(await resp.read()) > size  # stored
    port = gw.server.port
    assert port is not None

    async def slow_reader() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw_tools_list("slow"))
        await writer.drain()
        reader._transport.pause_reading()  # type: ignore[attr-defined]
        await asyncio.sleep(3.0)  # reads nothing, well past the deadline
        reader._transport.resume_reading()  # type: ignore[attr-defined]
        received = 0
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(10):
                while chunk := await reader.read(1 << 20):
                    received += len(chunk)
        writer.close()
        return received

    received = await asyncio.gather(*(slow_reader() for _ in range(10)))
    assert all(r < size for r in received), received  # dropped, not kept waiting with the answer
    async with http.post(gw.url("up"), json=rpc("tools/list", 2), headers=mcp_headers("tools/list")) as resp:
        assert resp.status == 200 and "hit" in resp.headers["Cache-Status"]
        assert len(await resp.read()) > size  # a caller that reads gets it whole


# -- 6, 7. odd bytes are the caller's error, not the gateway's ---------------------------------------


async def test_an_authorization_header_that_is_not_utf8_is_401_not_500(
    start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    gw = await start_gateway(gateway_config(upstream, auth={"tokens": [TOKEN]}))
    assert gw.server.port is not None
    body = json.dumps(rpc("tools/list")).encode()
    for path in (b"/servers/up/mcp", b"/v0.1/servers", b"/registry/versions", b"/metrics"):
        verb = b"POST" if path.startswith(b"/servers") else b"GET"
        head = (
            verb + b" " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n"
            b"Authorization: Bearer \xff\xfe\xfd-not-utf8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % len(body)
        )
        status, answer = status_and_json(await raw_exchange(gw.server.port, head, body))
        assert status == 401, path
        assert answer["error"]["code"] == -32600


async def test_a_corrupt_gzip_body_is_a_parse_error_not_a_500(
    start_upstream: StartUpstream, start_gateway: StartGateway
) -> None:
    upstream = await start_upstream()
    gw = await start_gateway(gateway_config(upstream))
    assert gw.server.port is not None
    body = b"\x1f\x8b\x08\x00not really gzip at all"
    head = (
        b"POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    status, answer = status_and_json(await raw_exchange(gw.server.port, head, body))
    assert status == 400 and answer["error"]["code"] == -32700
    assert upstream.requests == []


# -- 8. /metrics names the fleet ---------------------------------------------------------------------


async def test_with_auth_metrics_need_a_token_of_their_own_or_a_callers(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    scrape = "scraper-token-0123456789"
    callers_only = await start_gateway(gateway_config(upstream, auth={"tokens": [TOKEN]}))
    own = await start_gateway(gateway_config(upstream, auth={"tokens": [TOKEN], "metrics_tokens": [scrape]}))
    cases = [
        (callers_only, None, 401),
        (callers_only, TOKEN, 200),
        (own, None, 401),
        (own, TOKEN, 401),
        (own, scrape, 200),
    ]
    for gw, token, expected in cases:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with http.get(f"{gw.base_url}/metrics", headers=headers) as resp:
            text = await resp.text()
            assert resp.status == expected, (token, text[:200])
            if expected == 401:
                assert '"up"' not in text and "mcp_gateway_" not in text
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")


# -- 10. one answer per id, and a parser linear in its input -----------------------------------------


async def test_an_event_over_max_response_bytes_ends_the_stream_with_one_answer(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    async def huge_event_then_answer(request: web.Request, msg: Any) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        note = sse_frame({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * 5000}})
        for start in range(0, len(note), 1500):  # in pieces: the gateway holds it as it grows
            await out.write(note[start : start + 1500])
            await asyncio.sleep(0.05)
        await out.write(sse_frame({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": []}}))
        await out.write_eof()
        return out

    upstream = await start_upstream()
    upstream.handlers["tools/call"] = huge_event_then_answer
    gw = await start_gateway(gateway_config(upstream, upstream={"max_response_bytes": 1000}))
    headers = mcp_headers("tools/call", "t")
    async with http.post(gw.url("up"), json=rpc("tools/call", 7, name="t"), headers=headers) as resp:
        raw = await resp.read()
    parser = SSEParser(1 << 20)
    answers = []
    for data in parser.feed(raw) + parser.finish():
        try:
            message = json.loads(data)
        except ValueError:
            continue  # the cut event: no JSON
        if isinstance(message, dict) and message.get("id") == 7:
            answers.append(message)
    assert len(answers) == 1 and answers[0]["error"]["code"] == -32603, answers


def test_the_sse_parser_is_linear_in_a_long_line_split_into_small_chunks() -> None:
    """Every chunk once searched the whole held line and copied it: 16x the time for 4x the input."""

    def seconds(chunks: int) -> float:
        parser = SSEParser(1 << 30)
        started = time.perf_counter()
        parser.feed(b"data: ")
        for _ in range(chunks):
            parser.feed(b"xxxxxxxx")
        (event,) = parser.feed(b"\n\n")
        assert len(event) == chunks * 8
        return time.perf_counter() - started

    small, large = min(seconds(20_000) for _ in range(3)), min(seconds(80_000) for _ in range(3))
    assert large < 8 * small + 0.05, (small, large)  # linear: about 4x


# -- 11. listen streams and observed versions ----------------------------------------------------------


async def test_open_listen_streams_do_not_crowd_out_requests_and_have_their_own_bound(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    async def hold_listen(request: web.Request, msg: Any) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b": open\n\n")
        await asyncio.sleep(30)
        return out

    upstream = await start_upstream()
    upstream.handlers["subscriptions/listen"] = hold_listen
    gw = await start_gateway(gateway_config(upstream, upstream={"max_inflight": 2, "max_listen_streams": 3}))
    listen = rpc("subscriptions/listen", "l", notifications={"toolsListChanged": True})
    held = []
    for _ in range(3):
        resp = await http.post(gw.url("up"), json=listen, headers=mcp_headers("subscriptions/listen"))
        assert resp.status == 200
        await resp.content.readline()
        held.append(resp)
    try:
        async with http.post(gw.url("up"), json=listen, headers=mcp_headers("subscriptions/listen")) as resp:
            assert resp.status == 503 and "Retry-After" in resp.headers  # the fourth stream
        for i in range(2):  # max_inflight requests, with three listen streams open
            async with http.post(gw.url("up"), json=rpc("ping", i), headers=mcp_headers("ping")) as resp:
                assert resp.status == 200
    finally:
        for resp in held:
            resp.close()


async def test_a_version_the_gateway_does_not_know_is_never_recorded_as_observed(
    start_upstream: StartUpstream, start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    gw = await start_gateway(gateway_config(upstream))
    for version in ("9999-12-31", "zzzz", V):
        msg = rpc("tools/list", version=version)
        async with http.post(gw.url("up"), json=msg, headers=mcp_headers("tools/list", version=version)) as resp:
            assert resp.status == 200
    async with http.get(f"{gw.base_url}/registry/versions") as resp:
        observed = (await resp.json())["upstreams"]["up"]["observed"]
    assert observed == [V]


# -- 9. nothing of a request in the log, and a bounded amount of it ------------------------------------


async def test_malformed_requests_log_no_request_text_no_traceback_and_a_bounded_volume(tmp_path: Path) -> None:
    """aiohttp logs what it cannot parse at ERROR, with a traceback quoting the raw request
    (``Authorization`` included). Through ``mcp-gateway serve``, as operators run it."""
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[listener]\nport = {port}\n[registry]\nenabled = false\n[upstreams.up]\nurl = "http://127.0.0.1:9/mcp"\n'
    )
    log = tmp_path / "stderr.log"
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--log-format", "text"]
    with log.open("wb") as stderr:  # the gateway of this checkout, as `mcp-gateway serve` runs it
        proc = await asyncio.create_subprocess_exec(*argv, stderr=stderr, stdout=stderr, cwd=ROOT)
    try:
        async with asyncio.timeout(20):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
        secret = b"Bearer s3cret-that-must-not-be-logged"
        bad = [
            b"POST /servers/up/mcp HTTP/1.1\nHost: 127.0.0.1\nAuthorization: " + secret + b"\nContent-Length: 2\n\n{}",
            b"POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + secret + b"\r\nBad Header\r\n\r\n",
            b"POST /servers/up/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
            + secret
            + b"\r\nContent-Encoding: gzip\r\nContent-Length: 9\r\n\r\n\x1f\x8b\x08garbage",
        ]
        for i in range(150):
            await raw_exchange(port, bad[i % len(bad)], read_s=2.0)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)
    text = log.read_text(errors="replace")
    assert "s3cret" not in text
    assert "Traceback" not in text
    server_lines = [line for line in text.splitlines() if "aiohttp.server" in line]
    assert 1 <= len(server_lines) <= 20, server_lines[:30]  # 150 malformed requests
    assert all(" ERROR " not in line for line in server_lines)
