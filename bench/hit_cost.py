"""Where a cache hit's time goes in the gateway's own code: the handler alone, then step by step.

Usage: python bench/hit_cost.py [--method tools/list] [--method server/discover] [--rounds 9]

Starts the SDK upstream (bench/upstream_25_tools.py) and, in this process, the gateway app on
127.0.0.1 (no access-log output: lines go to /dev/null, but are formatted and written as when
they go to a file), warms its cache with one real request per method, then calls route handlers
directly with ready requests (``aiohttp.test_utils.make_mocked_request``, the body already
arrived, as a small POST's has when its handler runs): no sockets, no HTTP parsing, no event
loop turns. Prints, per method, microseconds per request (best of ``--rounds`` rounds of 1,000):

1. the handlers: the floor's (bench/floor.py: read the body, answer fixed bytes), the
   gateway's (``HotProxy``) and its plain path (``Proxy``, ``--plain-path``);
2. the steps of the hot path's hit (``gateway/proxy/hot.py``, ``HotProxy.lean_hit``), each timed
   alone on the objects a hit uses, in the order they run, with the record's share of the
   journal's batch (metrics and access log) amortised over its requests.

A step's figure is its cost warm in the CPU caches; inside a serving process, between the event
loop, aiohttp and the kernel, the same code takes about half as long again (compare the handler
figures with ``make bench``'s CPU per request). Binds 127.0.0.1 only; stops what it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import test_utils, web
from aiohttp.streams import StreamReader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.app import PROXY, create_app  # noqa: E402
from gateway.codec import id_json  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from gateway.protocol import request_template  # noqa: E402
from gateway.proxy.exchange import hit_status  # noqa: E402
from gateway.proxy.hot import _CACHE_STATUS, _JSON_HEADERS, HotProxy, LeanPiecesResponse  # noqa: E402
from gateway.telemetry import ACCESS_LOGGER  # noqa: E402
from gateway.telemetry.accesslog import AccessLogHandler  # noqa: E402

HOST = "127.0.0.1"
V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
PER_ROUND = 1000


def body_of(method: str) -> bytes:
    """The compact request SDK clients send."""
    msg = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": META}}
    return json.dumps(msg, separators=(",", ":")).encode()


def headers_of(method: str, size: int) -> dict[str, str]:
    return {
        "Host": HOST,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": V,
        "Mcp-Method": method,
        "Content-Length": str(size),
    }


class _Protocol:
    """What a request's body stream asks of its connection."""

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass

    def pause_reading(self) -> None:
        pass


def requests_of(app: web.Application, method: str, count: int) -> list[web.Request]:
    """``count`` POSTs of ``method`` to ``/servers/workspace/mcp``, each body arrived whole."""
    body = body_of(method)
    made = []
    for _ in range(count):
        content = StreamReader(_Protocol(), 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        content.feed_data(body)
        content.feed_eof()
        made.append(
            test_utils.make_mocked_request(
                "POST", "/servers/workspace/mcp", headers=headers_of(method, len(body)), payload=content, app=app
            )
        )
    return made


def per_request(handler: Callable[[web.Request], Any], requests: list[web.Request], rounds: int) -> float:
    """Best µs per request of ``handler`` (a coroutine function that never suspends) over rounds."""
    best = float("inf")
    for r in range(rounds):
        chunk = requests[r * PER_ROUND : (r + 1) * PER_ROUND]
        started = time.perf_counter()
        for request in chunk:
            try:
                handler(request).send(None)
            except StopIteration:
                pass
        best = min(best, (time.perf_counter() - started) / len(chunk) * 1e6)
    return best


def timed(step: Callable[[], object], rounds: int) -> float:
    """Best µs per call of ``step``."""
    return min(timeit.repeat(step, number=PER_ROUND, repeat=rounds)) / PER_ROUND * 1e6


async def handler_of(app: web.Application) -> Callable[[web.Request], Any]:
    match = await app.router.resolve(test_utils.make_mocked_request("POST", "/servers/workspace/mcp", app=app))
    return match.handler


async def measure(upstream_url: str, methods: list[str], rounds: int) -> None:
    config = parse_config(
        {"registry": {"enabled": False}, "upstreams": {"workspace": {"url": upstream_url}}},
        env={},
    )
    hot_app, plain_app = create_app(config), create_app(config, hot_path=False)
    async with (
        test_utils.TestClient(test_utils.TestServer(hot_app, host=HOST)) as hot_client,
        test_utils.TestClient(test_utils.TestServer(plain_app, host=HOST)) as plain_client,
    ):
        for client in (hot_client, plain_client):
            for method in methods:
                body = body_of(method)
                async with client.post("/servers/workspace/mcp", data=body, headers=headers_of(method, len(body))) as r:
                    assert r.status == 200, await r.text()
        hot, plain = await handler_of(hot_app), await handler_of(plain_app)
        proxy = hot_app[PROXY]
        assert isinstance(proxy, HotProxy)
        for method in methods:
            canned: dict[str, bytes] = {}

            async def floor(request: web.Request, canned: dict[str, bytes] = canned) -> web.Response:
                await request.read()
                return web.Response(body=canned["body"], content_type="application/json")

            reqs = requests_of(hot_app, method, PER_ROUND * rounds + 1)
            first = hot(reqs.pop())
            try:
                first.send(None)
            except StopIteration as stop:
                response = stop.value
            assert "hit" in response.headers["Cache-Status"], response.headers
            # the one-step hit's pieces are joined with the head when aiohttp writes them
            canned["body"] = b"".join(response.pieces) if isinstance(response, LeanPiecesResponse) else response.body
            print(f"\n{method} ({len(canned['body'])} B), µs per request, best of {rounds} rounds of {PER_ROUND}")
            figures = {
                "floor handler": per_request(floor, requests_of(hot_app, method, PER_ROUND * rounds), rounds),
                "gateway handler (hot path)": per_request(hot, reqs, rounds),
                "gateway handler (plain path)": per_request(
                    plain, requests_of(plain_app, method, PER_ROUND * rounds), rounds
                ),
            }
            for label, figure in figures.items():
                print(f"  {label:<32} {figure:6.2f}")
            over = figures["gateway handler (hot path)"] - figures["floor handler"]
            print(f"  {'hot path over the floor':<32} {over:6.2f}")
            steps(proxy, hot_app, method, rounds)


def steps(proxy: HotProxy, app: web.Application, method: str, rounds: int) -> None:
    """The steps of ``HotProxy.lean_hit`` for a hit, each timed alone."""
    body = body_of(method)
    request = requests_of(app, method, 1)[0]
    headers = request.headers
    pipeline = proxy.pipeline
    found = request_template(body, headers)
    assert found is not None
    plan = proxy.plans[("workspace", found[1])]
    key = plan[0]
    entry = proxy.store.get(key)
    assert entry is not None
    now = proxy.clock()
    pieces, ttl_ms = entry.hit_pieces(id_json(1), now)
    length = sum(map(len, pieces))
    status = hit_status(ttl_ms, False)
    journal = pipeline.journal

    def record() -> None:
        pipeline.record_hit("workspace", method, status, 0.0)

    def body_now() -> None:
        content = StreamReader(_Protocol(), 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        content.feed_data(body)
        content.feed_eof()
        content.is_eof()
        content.exception()
        content.read_nowait()

    def stream_alone() -> None:
        content = StreamReader(_Protocol(), 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        content.feed_data(body)
        content.feed_eof()

    def response() -> None:
        headers = _JSON_HEADERS.copy()
        headers[_CACHE_STATUS] = status
        LeanPiecesResponse(pieces, length, headers)

    rows = [
        ("Host and Origin at a glance (usual_connection)", lambda: pipeline.usual_connection(request)),
        ("the body from the connection (read_nowait)", lambda: timed(body_now, 1) - timed(stream_alone, 1)),
        ("the request's template (request_template)", lambda: request_template(body, headers)),
        ("its plan: cache key and method (plans.get)", lambda: proxy.plans.get(("workspace", found[1]))),
        ("the entry (store.get)", lambda: proxy.store.get(key)),
        ("the clock and the refresh check", lambda: proxy.clock() >= entry.refresh_at),
        ("the id's JSON (id_json)", lambda: id_json(1)),
        ("the answer's pieces and length (entry.hit_pieces)", lambda: sum(map(len, entry.hit_pieces(b"1", now)[0]))),
        ("Cache-Status (hit_status)", lambda: hit_status(ttl_ms, False)),
        ("headers and LeanPiecesResponse", response),
        ("the record, its share of the batch (record_hit)", record),
    ]
    total = 0.0
    for label, step in rows:
        if label.startswith("the body"):
            figure = min(step() for _ in range(rounds))  # type: ignore[misc]
        else:
            figure = timed(step, rounds)
        total += figure
        print(f"    {label:<50} {figure:6.2f}")
    journal.drain()
    print(f"    {'sum of the steps':<50} {total:6.2f}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", action="append", help="tools/list, server/discover (default both)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    access = logging.getLogger(ACCESS_LOGGER)
    access.setLevel(logging.INFO)
    access.propagate = False
    access.addHandler(AccessLogHandler(open(os.devnull, "w")))
    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "upstream_25_tools.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((HOST, port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the upstream did not start") from None
                time.sleep(0.2)
        asyncio.run(measure(f"http://{HOST}:{port}/mcp", args.method or ["tools/list", "server/discover"], args.rounds))
    finally:
        upstream.terminate()
        upstream.wait(30)


if __name__ == "__main__":
    main()
