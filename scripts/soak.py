"""Soak test: mixed traffic through a real gateway process for a while, then a report.

Usage: .venv/bin/python scripts/soak.py [--duration 60] [--concurrency 16] [--max-requests 500000]
                                        [--cache-entries 64] [--listeners 3] [--json bench-results/soak.json]

What runs, all on 127.0.0.1:
* the gateway, as ``mcp-gateway serve --config <generated toml>`` (a subprocess), with a small
  ``[cache] max_entries`` so the cache fills and evicts, and its registry probing and listening;
* real SDK upstreams from ``tests/servers``: ``public_upstream`` (hits, misses, SSE progress
  streams from ``slow_progress``), ``private_upstream`` (private answers, caller tokens forwarded),
  ``changing_upstream`` (``subscriptions/listen`` streams through the gateway, with notifications
  driven by its ``/_bump_resource`` and ``/_add_tool``);
* two scripted aiohttp upstreams in this process (own thread and event loop): a slow one (some
  answers come after the gateway's ``timeout_s``) and a failing one (HTML 500s, garbage, wrong ids,
  connection resets, cut SSE streams). Each request says which behaviour it wants, so the expected
  outcome of every request is known.

Every answer is checked (status, JSON-RPC shape, id, result contents, Cache-Status); the outcome is
counted as ``ok``, an expected error (``expected:<kind>``) or an unexpected one
(``unexpected:<kind>``, with samples). The gateway's resident memory (VmRSS, its process tree) is
sampled at start, once the cache is full, every few seconds and at the end; growth after the cache
filled is reported. Exit status: 0; 1 when there was any unexpected error; 2 when resident memory
grew by more than ``--max-rss-growth-mb`` after the cache filled; 3 when the run could not start.
The run is bounded by ``--duration`` and ``--max-requests``; every request by ``REQUEST_TIMEOUT_S``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.fleet import run_server  # noqa: E402

V = "2026-07-28"
PV_KEY = "io.modelcontextprotocol/protocolVersion"
CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"
ACCEPT = "application/json, text/event-stream"
REQUEST_TIMEOUT_S = 10.0
SLOW_TIMEOUT_S = 1.5  # the slow upstream's timeout_s in the gateway config
LISTEN_ACK_TIMEOUT_S = 5.0
SAMPLE_EVERY_S = 5.0
MAX_SAMPLES_PER_KIND = 5


# -- JSON-RPC helpers --------------------------------------------------------------------------------


def rpc_body(method: str, request_id: object, params: dict[str, Any] | None = None, **meta: Any) -> bytes:
    p = dict(params or {})
    p["_meta"] = {
        PV_KEY: V,
        CAPS_KEY: {},
        "io.modelcontextprotocol/clientInfo": {"name": "soak", "version": "1"},
        **meta,
    }
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": p}).encode()


def rpc_headers(method: str, name: str | None = None, **extra: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": V, "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    headers.update(extra)
    return headers


def sse_messages(raw: bytes) -> list[Any]:
    """JSON messages of the complete events in an SSE body (CRLF, LF or CR line endings)."""
    text = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    out = []
    for block in text.split(b"\n\n")[:-1]:
        data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if data:
            try:
                out.append(json.loads(b"\n".join(data)))
            except ValueError:
                out.append(None)
    return out


class Unexpected(Exception):
    """An answer that is not what this request should get; ``kind`` names the problem."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass
class Reply:
    status: int
    content_type: str
    cache_status: str
    raw: bytes

    def messages(self) -> list[Any]:
        if self.content_type == "text/event-stream":
            return sse_messages(self.raw)
        try:
            return [json.loads(self.raw)]
        except ValueError:
            return [None]

    def response(self, request_id: object) -> dict[str, Any]:
        """The JSON-RPC response to ``request_id`` (exactly one, else Unexpected)."""
        found = [
            m
            for m in self.messages()
            if isinstance(m, dict) and m.get("jsonrpc") == "2.0" and ("result" in m or "error" in m)
        ]
        mine = [m for m in found if m.get("id") == request_id]
        if len(mine) != 1 or len(found) != 1:
            raise Unexpected("bad-jsonrpc", f"HTTP {self.status} {self.content_type}: {self.raw[:300]!r}")
        return mine[0]


def expect_result(reply: Reply, request_id: object) -> dict[str, Any]:
    if reply.status != 200:
        raise Unexpected(f"http-{reply.status}", reply.raw[:300].decode(errors="replace"))
    msg = reply.response(request_id)
    if "result" not in msg:
        raise Unexpected("jsonrpc-error", json.dumps(msg)[:300])
    return dict(msg["result"])


def expect_error(reply: Reply, request_id: object, status: int, code: int) -> None:
    if reply.status != status:
        raise Unexpected(f"http-{reply.status}-not-{status}", reply.raw[:300].decode(errors="replace"))
    msg = reply.response(request_id)
    if msg.get("error", {}).get("code") != code:
        raise Unexpected("wrong-error-code", json.dumps(msg)[:300])


# -- scripted upstreams (own thread, own event loop) -------------------------------------------------------


def _answer(request_id: object, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _call_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "resultType": "complete"}


async def slow_handler(request: web.Request) -> web.StreamResponse:
    """tools/call ``sleep`` {ms}: answers after ``ms`` milliseconds; anything else at once."""
    msg = json.loads(await request.read())
    if "id" not in msg:
        return web.Response(status=202)
    ms = msg.get("params", {}).get("arguments", {}).get("ms", 0)
    await asyncio.sleep(ms / 1000)
    if msg.get("method") == "server/discover":
        return web.json_response(
            _answer(
                msg["id"],
                {
                    "resultType": "complete",
                    "supportedVersions": [V],
                    "capabilities": {},
                    "ttlMs": 5000,
                    "cacheScope": "public",
                },
            )
        )
    return web.json_response(_answer(msg["id"], _call_result(f"slept {ms} ms")))


def _sse(msg: object) -> bytes:
    return b"event: message\ndata: " + json.dumps(msg).encode() + b"\n\n"


async def flaky_handler(request: web.Request) -> web.StreamResponse:
    """tools/call ``fail`` {mode}: misbehaves as ``mode`` says (see FLAKY_MODES)."""
    msg = json.loads(await request.read())
    if "id" not in msg:
        return web.Response(status=202)
    request_id = msg["id"]
    mode = msg.get("params", {}).get("arguments", {}).get("mode", "ok")
    if mode == "html500":
        return web.Response(
            status=500, text="<html><body>Internal Server Error</body></html>", content_type="text/html"
        )
    if mode == "garbage":
        return web.Response(status=200, body=b'{"jsonrpc":"2.0","id":', content_type="application/json")
    if mode == "wrong-id":
        return web.json_response(_answer(f"not-{request_id}", _call_result("stray")))
    if mode == "empty-202":
        return web.Response(status=202)
    if mode == "reset":
        assert request.transport is not None
        request.transport.close()
        return web.Response(status=200)
    if mode in ("sse-ok", "sse-cut"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        progress = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "p", "progress": 1},
        }
        await resp.write(_sse(progress))
        if mode == "sse-cut":  # at an event boundary: the gateway's error event must follow intact
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(_sse(_answer(request_id, _call_result("streamed"))))
        return resp
    return web.json_response(_answer(request_id, _call_result("fine")))


#: mode -> (expected HTTP status, expected outcome label)
FLAKY_MODES: dict[str, tuple[int, str]] = {
    "ok": (200, "ok"),
    "sse-ok": (200, "ok"),
    "html500": (502, "expected:bad-gateway"),
    "garbage": (502, "expected:bad-gateway"),
    "wrong-id": (502, "expected:bad-gateway"),
    "empty-202": (502, "expected:bad-gateway"),
    "reset": (502, "expected:bad-gateway"),
    "sse-cut": (200, "expected:stream-cut"),
}


class ScriptedUpstreams:
    """The slow and the failing upstream, served from a thread with its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="scripted-upstreams", daemon=True)
        self.runners: list[web.AppRunner] = []
        self.urls: dict[str, str] = {}

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        for name, handler in (("slow", slow_handler), ("flaky", flaky_handler)):
            app = web.Application()
            app.router.add_post("/mcp", handler)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.runners.append(runner)
            self.urls[name] = f"http://127.0.0.1:{port}/mcp"

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner in self.runners:
                await runner.cleanup()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# -- the gateway process ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_config(port: int, cache_entries: int, urls: dict[str, str]) -> str:
    def up(name: str, url: str, **extra: str) -> str:
        lines = [f"[upstreams.{name}]", f'url = "{url}"', *(f"{k} = {v}" for k, v in extra.items())]
        return "\n".join(lines)

    return "\n\n".join(
        [
            f'[listener]\nhost = "127.0.0.1"\nport = {port}',
            f"[cache]\nmax_entries = {cache_entries}",
            "[registry]\nprobe_min_interval_s = 2.0\nprobe_max_interval_s = 5.0\nprobe_timeout_s = 3.0\n"
            "backoff_base_s = 0.5\nbackoff_max_s = 5.0",
            up("pub", urls["pub"]),
            up("priv", urls["priv"], forward_authorization="true"),
            up("chg", urls["chg"]),
            up("slow", urls["slow"], timeout_s=str(SLOW_TIMEOUT_S)),
            up("flaky", urls["flaky"], timeout_s="5.0"),
        ]
    )


def rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` and its descendants, in KiB (0 when gone)."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{current}/status").read_text()
            match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
            total += int(match.group(1)) if match else 0
            for task in Path(f"/proc/{current}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in (task / "children").read_text().split()]
    return total


@contextlib.contextmanager
def gateway_process(config_text: str, log_path: Path) -> Any:
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        config = Path(tmp) / "gateway.toml"
        config.write_text(config_text)
        exe = Path(sys.executable).parent / "mcp-gateway"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
        cmd += ["serve", "--config", str(config), "--log-level", "warning", "--log-format", "json"]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


async def wait_ready(http: aiohttp.ClientSession, base: str, proc: subprocess.Popen[bytes], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{base}/readyz") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the gateway was not ready within {within_s:g} s")


async def metric(http: aiohttp.ClientSession, base: str, name: str) -> float:
    """Sum of every sample of metric ``name`` (0 when absent)."""
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- the load -------------------------------------------------------------------------------------------------


@dataclass
class Stats:
    started: float = field(default_factory=time.monotonic)
    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    samples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    cache: Counter[str] = field(default_factory=Counter)
    listen: Counter[str] = field(default_factory=Counter)
    requests: int = 0

    def record(self, kind: str, outcome: str, elapsed_s: float, detail: str | None = None) -> None:
        self.outcomes[outcome] += 1
        self.by_kind[kind][outcome] += 1
        self.latencies[kind].append(elapsed_s)
        if (
            detail is not None
            and outcome.startswith("unexpected")
            and len(self.samples[outcome]) < MAX_SAMPLES_PER_KIND
        ):
            self.samples[outcome].append(f"{kind}: {detail}"[:500])


class Load:
    """The request mix; each ``op_*`` sends one request and returns its outcome label."""

    def __init__(self, http: aiohttp.ClientSession, base: str, rng: random.Random, stats: Stats) -> None:
        self.http = http
        self.base = base
        self.rng = rng
        self.stats = stats
        self.ids = iter(range(1, 1 << 62))
        self.mix: list[tuple[Callable[[], Any], int]] = [
            (self.op_hit, 30),
            (self.op_miss, 18),
            (self.op_private, 10),
            (self.op_progress, 8),
            (self.op_call, 7),
            (self.op_slow, 10),
            (self.op_flaky, 12),
            (self.op_invalid, 5),
        ]

    async def post(self, upstream: str, body: bytes, headers: dict[str, str]) -> Reply:
        url = f"{self.base}/servers/{upstream}/mcp"
        async with self.http.post(url, data=body, headers=headers) as resp:
            raw = await resp.read()
            return Reply(resp.status, resp.content_type, resp.headers.get("Cache-Status", ""), raw)

    def note_cache(self, reply: Reply) -> None:
        status = reply.cache_status
        if not status.startswith("mcp-gateway"):
            raise Unexpected("no-cache-status", repr(status))
        self.stats.cache["hit" if "; hit" in status else "stored" if "stored" in status else "other"] += 1

    async def op_hit(self) -> str:
        method = self.rng.choice(["tools/list", "prompts/list", "resources/list", "resources/templates/list"])
        rid = next(self.ids)
        reply = await self.post("pub", rpc_body(method, rid), rpc_headers(method))
        self.note_cache(reply)
        result = expect_result(reply, rid)
        key = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources"}.get(
            method, "resourceTemplates"
        )
        if not result.get(key) or result.get("cacheScope") != "public":
            raise Unexpected("wrong-result", json.dumps(result)[:200])
        return "ok"

    async def op_miss(self) -> str:
        item = self.rng.randrange(100_000)  # mostly new keys: the small cache fills and evicts
        rid = f"m-{next(self.ids)}"
        uri = f"res://items/{item}"
        reply = await self.post(
            "pub", rpc_body("resources/read", rid, {"uri": uri}), rpc_headers("resources/read", uri)
        )
        self.note_cache(reply)
        result = expect_result(reply, rid)
        if result["contents"][0].get("text") != f"item {item}":
            raise Unexpected("wrong-result", json.dumps(result)[:200])
        return "ok"

    async def op_private(self) -> str:
        rid = next(self.ids)
        token = f"Bearer soak-caller-{self.rng.randrange(20)}"
        reply = await self.post("priv", rpc_body("tools/list", rid), rpc_headers("tools/list", Authorization=token))
        self.note_cache(reply)
        result = expect_result(reply, rid)
        if result.get("cacheScope") != "private" or "; hit" in reply.cache_status:
            raise Unexpected("private-served-from-cache", reply.cache_status)
        return "ok"

    async def op_progress(self) -> str:
        rid = f"p-{next(self.ids)}"
        params = {"name": "slow_progress", "arguments": {"steps": 3, "delay_ms": 20}}
        body = rpc_body("tools/call", rid, params, progressToken=f"tok-{rid}")
        reply = await self.post("pub", body, rpc_headers("tools/call", "slow_progress"))
        if reply.content_type != "text/event-stream":
            raise Unexpected("progress-not-sse", reply.content_type)
        messages = reply.messages()
        progress = [m for m in messages if isinstance(m, dict) and m.get("method") == "notifications/progress"]
        result = expect_result(reply, rid)
        if len(progress) != 3 or "done after 3 steps" not in json.dumps(result):
            raise Unexpected("progress-stream", f"{len(progress)} progress events; {json.dumps(result)[:200]}")
        return "ok"

    async def op_call(self) -> str:
        rid = next(self.ids)
        a, b = self.rng.randrange(1000), self.rng.randrange(1000)
        body = rpc_body("tools/call", rid, {"name": "add", "arguments": {"a": a, "b": b}})
        result = expect_result(await self.post("pub", body, rpc_headers("tools/call", "add")), rid)
        if str(a + b) not in json.dumps(result):
            raise Unexpected("wrong-result", json.dumps(result)[:200])
        return "ok"

    async def op_slow(self) -> str:
        rid = next(self.ids)
        roll = self.rng.random()
        ms = self.rng.randrange(20, 400) if roll < 0.7 else self.rng.randrange(600, 1200) if roll < 0.9 else 2500
        reply = await self.post(
            "slow",
            rpc_body("tools/call", rid, {"name": "sleep", "arguments": {"ms": ms}}),
            rpc_headers("tools/call", "sleep"),
        )
        if ms / 1000 > SLOW_TIMEOUT_S:
            expect_error(reply, rid, 504, -32603)
            return "expected:upstream-timeout"
        expect_result(reply, rid)
        return "ok"

    async def op_flaky(self) -> str:
        rid = next(self.ids)
        mode = self.rng.choice(list(FLAKY_MODES))
        status, label = FLAKY_MODES[mode]
        body = rpc_body("tools/call", rid, {"name": "fail", "arguments": {"mode": mode}})
        reply = await self.post("flaky", body, rpc_headers("tools/call", "fail"))
        if label == "ok":
            expect_result(reply, rid)
        else:
            expect_error(reply, rid, status, -32603)
        return label

    async def op_invalid(self) -> str:
        rid = next(self.ids)
        reply = await self.post("pub", rpc_body("tools/list", rid), rpc_headers("prompts/list"))  # Mcp-Method mismatch
        expect_error(reply, rid, 400, -32020)
        return "expected:header-mismatch"

    def pick(self) -> Callable[[], Any]:
        ops, weights = zip(*self.mix, strict=True)
        return self.rng.choices(ops, weights)[0]  # type: ignore[no-any-return]

    async def worker(self, deadline: float, max_requests: int) -> None:
        while time.monotonic() < deadline and self.stats.requests < max_requests:
            self.stats.requests += 1
            op = self.pick()
            kind = op.__name__.removeprefix("op_")
            started = time.perf_counter()
            detail = None
            try:
                outcome = await asyncio.wait_for(op(), REQUEST_TIMEOUT_S)
            except Unexpected as exc:
                outcome, detail = f"unexpected:{exc.kind}", exc.detail
            except TimeoutError:
                outcome, detail = "unexpected:client-timeout", f"no answer within {REQUEST_TIMEOUT_S:g} s"
            except (aiohttp.ClientError, OSError) as exc:
                outcome, detail = f"unexpected:{type(exc).__name__}", str(exc)
            self.stats.record(kind, outcome, time.perf_counter() - started, detail)


async def listen_streams(
    http: aiohttp.ClientSession, base: str, chg_base: str, rng: random.Random, stats: Stats, deadline: float
) -> None:
    """Hold one ``subscriptions/listen`` stream after another through the gateway to changing_upstream."""
    n = 0
    while time.monotonic() < deadline:
        n += 1
        rid = f"listen-{id(rng)}-{n}"
        filt = {"toolsListChanged": True, "resourceSubscriptions": ["res://counter"]}
        body = rpc_body("subscriptions/listen", rid, {"notifications": filt})
        hold = min(rng.uniform(2.0, 6.0), max(0.0, deadline - time.monotonic()))
        started = time.perf_counter()
        outcome, detail = "ok", None
        try:
            async with http.post(
                f"{base}/servers/chg/mcp", data=body, headers=rpc_headers("subscriptions/listen")
            ) as resp:
                if resp.status != 200 or resp.content_type != "text/event-stream":
                    raise Unexpected(f"listen-http-{resp.status}", resp.content_type)
                seen = b""
                ack_by = time.monotonic() + LISTEN_ACK_TIMEOUT_S
                end = time.monotonic() + hold
                while time.monotonic() < end:
                    limit = (ack_by if b"acknowledged" not in seen else end) - time.monotonic()
                    try:
                        chunk = await asyncio.wait_for(resp.content.readany(), max(limit, 0.01))
                    except TimeoutError:
                        if b"acknowledged" not in seen:
                            raise Unexpected("listen-no-ack", f"nothing within {LISTEN_ACK_TIMEOUT_S:g} s") from None
                        break
                    if not chunk:
                        raise Unexpected("listen-ended", seen[-200:].decode(errors="replace"))
                    seen += chunk
                messages = [m for m in sse_messages(seen) if isinstance(m, dict)]
                if not messages or messages[0].get("method") != "notifications/subscriptions/acknowledged":
                    raise Unexpected("listen-ack-not-first", seen[:200].decode(errors="replace"))
                for m in messages[1:]:
                    sub = m.get("params", {}).get("_meta", {}).get("io.modelcontextprotocol/subscriptionId")
                    if sub != rid:
                        raise Unexpected("listen-subscription-id", json.dumps(m)[:200])
                stats.listen["notifications"] += len(messages) - 1
                stats.listen["streams"] += 1
        except Unexpected as exc:
            outcome, detail = f"unexpected:{exc.kind}", exc.detail
        except (aiohttp.ClientError, OSError) as exc:
            outcome, detail = f"unexpected:{type(exc).__name__}", str(exc)
        stats.record("listen", outcome, time.perf_counter() - started, detail)


async def notifier(http: aiohttp.ClientSession, chg_base: str, deadline: float) -> None:
    """Makes changing_upstream publish notifications now and then (directly, not via the gateway)."""
    n = 0
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        n += 1
        path = "/_add_tool" if n % 10 == 0 else "/_bump_resource"
        with contextlib.suppress(aiohttp.ClientError):
            async with http.post(f"{chg_base}{path}") as resp:
                await resp.read()


async def rss_sampler(pid: int, samples: list[tuple[float, int]], started: float, deadline: float) -> None:
    while time.monotonic() < deadline:
        samples.append((round(time.monotonic() - started, 1), rss_kb(pid)))
        await asyncio.sleep(SAMPLE_EVERY_S)


# -- report ------------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"soak: {summary['duration_s']} s, {summary['requests']} requests ({summary['requests_per_s']}/s), "
        f"{summary['listen']['streams']} listen streams, {summary['listen']['notifications']} notifications",
        "",
        f"{'kind':<10} {'requests':>9} {'ok':>8} {'expected':>9} {'unexpected':>10} {'p50 ms':>8} {'p99 ms':>8}",
    ]
    for kind, row in summary["by_kind"].items():
        lines.append(
            f"{kind:<10} {row['requests']:>9} {row['ok']:>8} {row['expected']:>9} {row['unexpected']:>10} "
            f"{row['p50_ms']:>8} {row['p99_ms']:>8}"
        )
    lat = summary["latency_ms"]
    lines += [
        f"{'all (no listen)':<21} p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms",
        "",
        "errors: " + (", ".join(f"{k} {v}" for k, v in sorted(summary["errors"].items())) or "none"),
        f"cache: {summary['cache']}",
        f"gateway RSS: start {summary['rss_mb']['start']} MB, cache full {summary['rss_mb']['cache_full']} MB, "
        f"end {summary['rss_mb']['end']} MB, max {summary['rss_mb']['max']} MB "
        f"(growth after the cache filled: {summary['rss_mb']['growth_after_full']} MB)",
        f"gateway log: {summary['gateway_log']['errors']} error lines ({summary['gateway_log']['path']})",
    ]
    for kind, samples in summary["unexpected_samples"].items():
        lines.append(f"  {kind}:")
        lines += [f"    {s}" for s in samples]
    lines.append(f"verdict: {summary['verdict']}")
    return "\n".join(lines)


def scan_log(path: Path) -> tuple[int, list[str]]:
    """Lines at ERROR/CRITICAL level (or tracebacks) in the gateway's log."""
    bad = []
    for line in path.read_text(errors="replace").splitlines():
        if '"level": "ERROR"' in line or '"level": "CRITICAL"' in line or line.startswith("Traceback"):
            bad.append(line[:400])
    return len(bad), bad[:MAX_SAMPLES_PER_KIND]


async def run(args: argparse.Namespace) -> int:
    out_dir = Path(args.json).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "soak-gateway.log"
    rng = random.Random(args.seed)
    scripted = ScriptedUpstreams()
    scripted.start()
    try:
        async with (
            run_server("public_upstream", env={"UPSTREAM_TTL_MS": "5000"}) as pub,
            run_server("private_upstream") as priv,
            run_server("changing_upstream") as chg,
        ):
            port = free_port()
            urls = {"pub": pub.url, "priv": priv.url, "chg": chg.url, **scripted.urls}
            with gateway_process(gateway_config(port, args.cache_entries, urls), log_path) as proc:
                return await drive(args, proc, f"http://127.0.0.1:{port}", chg.base_url, rng, log_path)
    finally:
        scripted.stop()


async def drive(
    args: argparse.Namespace,
    proc: subprocess.Popen[bytes],
    base: str,
    chg_base: str,
    rng: random.Random,
    log_path: Path,
) -> int:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        try:
            await wait_ready(http, base, proc, 30)
        except RuntimeError as exc:
            print(f"soak: {exc}; see {log_path}", file=sys.stderr)
            return 3
        await asyncio.sleep(0.5)
        stats = Stats()
        rss: list[tuple[float, int]] = []
        started = time.monotonic()
        deadline = started + args.duration
        rss_start = rss_kb(proc.pid)
        load = Load(http, base, rng, stats)
        tasks = [load.worker(deadline, args.max_requests) for _ in range(args.concurrency)]
        tasks += [
            listen_streams(http, base, chg_base, random.Random(rng.random()), stats, deadline)
            for _ in range(args.listeners)
        ]
        tasks += [notifier(http, chg_base, deadline), rss_sampler(proc.pid, rss, started, deadline)]

        full_at: list[float] = []

        async def watch_fill() -> None:
            while time.monotonic() < deadline and not full_at:
                with contextlib.suppress(aiohttp.ClientError, ValueError):
                    if await metric(http, base, "mcp_gateway_cache_entries") >= args.cache_entries:
                        full_at.append(time.monotonic() - started)
                        rss.append((round(full_at[0], 1), rss_kb(proc.pid)))
                        return
                await asyncio.sleep(0.5)

        tasks.append(watch_fill())
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
        rss.append((round(elapsed, 1), rss_kb(proc.pid)))
        evictions = await metric(http, base, "mcp_gateway_cache_evictions_total")
        entries = await metric(http, base, "mcp_gateway_cache_entries")
        alive = proc.poll() is None

    log_errors, log_samples = scan_log(log_path)
    all_latencies = [v for kind, vals in stats.latencies.items() if kind != "listen" for v in vals]
    rss_sorted = sorted(rss)
    full_rss = next((kb for t, kb in rss_sorted if full_at and t >= full_at[0]), rss_sorted[0][1])
    end_rss = rss_sorted[-1][1]
    growth_mb = round((end_rss - full_rss) / 1024, 1)
    unexpected = (
        sum(v for k, v in stats.outcomes.items() if k.startswith("unexpected")) + log_errors + (0 if alive else 1)
    )
    by_kind: dict[str, Any] = {}
    for kind in sorted(stats.by_kind):
        counts = stats.by_kind[kind]
        vals = stats.latencies[kind]
        by_kind[kind] = {
            "requests": sum(counts.values()),
            "ok": counts["ok"],
            "expected": sum(v for k, v in counts.items() if k.startswith("expected")),
            "unexpected": sum(v for k, v in counts.items() if k.startswith("unexpected")),
            "p50_ms": round(percentile(vals, 50) * 1000, 1),
            "p99_ms": round(percentile(vals, 99) * 1000, 1),
        }
    verdict = "pass"
    code = 0
    if unexpected:
        verdict, code = f"FAIL: {unexpected} unexpected errors", 1
    elif growth_mb > args.max_rss_growth_mb:
        verdict, code = f"FAIL: resident memory grew {growth_mb} MB after the cache filled", 2
    summary: dict[str, Any] = {
        "duration_s": round(elapsed, 1),
        "requests": sum(stats.outcomes.values()) - stats.by_kind["listen"].total(),
        "requests_per_s": round((sum(stats.outcomes.values()) - stats.by_kind["listen"].total()) / elapsed, 1),
        "concurrency": args.concurrency,
        "listen": {
            "streams": stats.listen["streams"],
            "notifications": stats.listen["notifications"],
            "clients": args.listeners,
        },
        "outcomes": dict(sorted(stats.outcomes.items())),
        "errors": {k: v for k, v in stats.outcomes.items() if k != "ok"},
        "expected_errors": sum(v for k, v in stats.outcomes.items() if k.startswith("expected")),
        "unexpected_errors": unexpected,
        "by_kind": by_kind,
        "latency_ms": {
            "p50": round(percentile(all_latencies, 50) * 1000, 1),
            "p99": round(percentile(all_latencies, 99) * 1000, 1),
            "max": round(max(all_latencies, default=0) * 1000, 1),
            "mean": round(statistics.fmean(all_latencies) * 1000, 1) if all_latencies else 0,
        },
        "cache": {
            "max_entries": args.cache_entries,
            "entries_at_end": int(entries),
            "full_after_s": round(full_at[0], 1) if full_at else None,
            "evictions": int(evictions),
            "answers": dict(stats.cache),
        },
        "rss_mb": {
            "start": round(rss_start / 1024, 1),
            "cache_full": round(full_rss / 1024, 1),
            "end": round(end_rss / 1024, 1),
            "max": round(max(kb for _, kb in rss) / 1024, 1),
            "growth_after_full": growth_mb,
            "samples": [(t, round(kb / 1024, 1)) for t, kb in rss_sorted],
        },
        "gateway_alive_at_end": alive,
        "gateway_log": {"path": str(log_path), "errors": log_errors, "samples": log_samples},
        "unexpected_samples": dict(stats.samples),
        "verdict": verdict,
        "seed": args.seed,
    }
    args.summary = summary
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (default 60)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent request loops (default 16)")
    parser.add_argument("--listeners", type=int, default=3, help="concurrent listen-stream clients (default 3)")
    parser.add_argument("--max-requests", type=int, default=500_000, help="stop after this many requests")
    parser.add_argument("--cache-entries", type=int, default=64, help="the gateway's [cache] max_entries (default 64)")
    parser.add_argument(
        "--max-rss-growth-mb", type=float, default=16.0, help="allowed RSS growth after the cache filled (default 16)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--json", default=str(ROOT / "bench-results" / "soak.json"), help="where to write the JSON")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    args.summary = None
    code = asyncio.run(run(args))
    if args.summary is not None:
        Path(args.json).write_text(json.dumps(args.summary, indent=2) + "\n")
        print(report(args.summary))
        print(f"(JSON: {args.json})")
    return code


if __name__ == "__main__":
    sys.exit(main())
