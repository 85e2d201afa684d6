"""Generations (gateway.generation): a request keeps the generation it began with to its end, and
reloads in a row leave nothing of the generations they replaced running.

In-process (the gateway on the test's event loop, on real sockets, in front of real SDK
upstreams from tests/servers/), to see the event loop's tasks.
"""

from __future__ import annotations

import asyncio
import copy
import json
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import METRICS, REGISTRY, RELOADER, create_app
from gateway.config import read_config

from ..aggregate.conftest import body_of
from ..aggregate.test_listen import Listening
from ..support import StartUpstream
from ..support.fleet import HOST, Upstream, fetch_counts
from ..support.polling import wait_until
from ..support.reloading import public, steady_load, tools_list
from ..support.replicas import ADMIN_TOKEN, dump_toml
from ..support.wire import mcp_headers, rpc


class Served:
    """The gateway of the file ``path``, served in-process on 127.0.0.1."""

    def __init__(self, path: Path) -> None:
        loaded = read_config(path)
        self.app: web.Application = create_app(
            loaded.config, config_sha256=loaded.sha256, reload_source=lambda: read_config(path)
        )
        self.server = TestServer(self.app, host=HOST)

    @property
    def base(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def url(self, upstream: str) -> str:
        return f"{self.base}/servers/{upstream}/mcp"


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Any]:
    """``await serve(config_dict)`` -> :class:`Served` of that config written as a file (with [admin])."""
    started: list[Served] = []
    path = tmp_path / "gw.toml"

    async def start(config: dict[str, Any]) -> Served:
        path.write_text(dump_toml({"admin": {"token": ADMIN_TOKEN}, **config}))
        served = Served(path)
        await served.server.start_server()
        started.append(served)
        return served

    yield start
    for served in started:
        await served.server.close()


async def test_a_request_in_flight_finishes_on_the_timeout_it_began_with_and_the_next_has_the_new_one(
    tmp_path: Path, serve: Any, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, _ = counted
    gw = await serve({"registry": {"enabled": False}, "upstreams": {"a": public(up_a, timeout_s=30)}})
    slow = {"name": "slow_progress", "arguments": {"steps": 6, "delay_ms": 250}}  # ~1.5 s, one JSON answer
    body = json.dumps(rpc("tools/call", 3, **slow)).encode()
    headers = mcp_headers("tools/call", "slow_progress")
    async with aiohttp.ClientSession() as http:

        async def call() -> tuple[int, dict[str, Any]]:
            async with http.post(gw.url("a"), data=body, headers=headers) as resp:
                return resp.status, await resp.json()

        first = asyncio.create_task(call())
        await wait_until(lambda: _called(up_a), what="the first call to reach the upstream")
        quick = {"admin": {"token": ADMIN_TOKEN}, "registry": {"enabled": False}}
        (tmp_path / "gw.toml").write_text(dump_toml({**quick, "upstreams": {"a": public(up_a, timeout_s=0.5)}}))
        outcome = gw.app[RELOADER].reload()
        assert outcome.error is None and outcome.diff is not None and outcome.diff.retuned == ("a",)
        second_status, second = await call()
        first_status, first_body = await first
    assert (first_status, first_body["result"]["structuredContent"]) == (200, {"result": "done after 6 steps"})
    assert second_status == 504 and second["error"]["code"] == -32603, second


def lasting_tasks() -> list[str]:
    """The event loop's tasks, by coroutine name, but this test's own and the short waits a listen
    stream holds between two streams (``sleep``, ``Event.wait``)."""
    current = asyncio.current_task()
    names = (task.get_coro().__qualname__ for task in asyncio.all_tasks() if task is not current)
    return sorted(name for name in names if name not in ("sleep", "Event.wait"))


async def _called(up: Upstream) -> bool:
    return (await fetch_counts(up)).get("tools/call", 0) >= 1


async def test_fifty_reloads_in_a_row_under_load_fail_no_request_and_leave_no_task_nor_memory_behind(
    tmp_path: Path, serve: Any, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    config: dict[str, Any] = {"upstreams": {"a": public(up_a), "b": public(up_b)}}
    gw = await serve(config)
    path = tmp_path / "gw.toml"
    urls = [gw.url("a"), gw.url("b")]
    await wait_until(lambda: gw.app[REGISTRY].ready, what="every upstream probed once")
    before = lasting_tasks()
    assert before.count("Registry._probe_loop") == 2 and before.count("ListenStream.run") == 2, before
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as http:  # closed before the count: no connection left
        load = asyncio.create_task(steady_load(http, urls, stop))
        tracemalloc.start()
        for i in range(50):  # c comes and goes, a is retuned each time (its entries stay)
            if i == 10:  # warm: every kind of reload done a few times
                warm = tracemalloc.get_traced_memory()[0]
            step = copy.deepcopy(config)
            step["upstreams"]["a"]["timeout_s"] = 10 + i
            if i % 2 == 0:
                step["upstreams"]["c"] = public(up_b, headers={"X-Fleet-Tag": str(i)})
            path.write_text(dump_toml({"admin": {"token": ADMIN_TOKEN}, **step}))
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with http.post(f"{gw.base}/admin/reload", headers=admin) as resp:
                assert resp.status == 200, await resp.text()
            await tools_list(http, urls[0])  # the load goes on between two reloads
        grown = tracemalloc.get_traced_memory()[0] - warm
        tracemalloc.stop()
        path.write_text(dump_toml({"admin": {"token": ADMIN_TOKEN}, **config}))
        assert gw.app[RELOADER].reload().error is None
        stop.set()
        sent, failures = await load
    assert failures == [], failures[:5]
    assert sent > 0

    try:  # a removed upstream's probe and listen stream end once cancelled (a while, on a busy machine)
        await wait_until(
            lambda: lasting_tasks() == before, limit_s=30, what=f"the loop's tasks to come back to {before}"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still running: {lasting_tasks()}") from None
    assert gw.app[METRICS].config_reloads.labels("ok")._value.get() == 51
    # 40 reloads after the first 10: what they left behind, the requests between them included.
    assert grown < 2 * 1024 * 1024, f"{grown} bytes more after 40 more reloads"


async def test_a_request_after_a_reload_that_changed_its_upstream_never_waits_for_a_fetch_begun_before(
    tmp_path: Path, serve: Any, counted: tuple[Upstream, Upstream], start_upstream: StartUpstream
) -> None:
    # A tools/list in flight to the old url (slow, then failing); the reload points `a` at a
    # healthy upstream. A request made after it must not join the old fetch (its wait, its failure).
    _, up_b = counted
    old = await start_upstream()
    release = asyncio.Event()

    async def slow_failure(request: web.Request, msg: Any) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=502, text="old backend gone")

    old.handlers["tools/list"] = slow_failure
    quiet = {"registry": {"enabled": False}}
    gw = await serve({**quiet, "upstreams": {"a": {"url": old.url, "timeout_s": 30}}})
    async with aiohttp.ClientSession() as http:
        first = asyncio.create_task(tools_list(http, gw.url("a"), 1))
        await wait_until(lambda: _true(bool(old.requests)), what="the first request at the old url")
        (tmp_path / "gw.toml").write_text(
            dump_toml({"admin": {"token": ADMIN_TOKEN}, **quiet, "upstreams": {"a": public(up_b)}})
        )
        outcome = gw.app[RELOADER].reload()
        assert outcome.diff is not None and outcome.diff.changed == ("a",)
        second = await asyncio.wait_for(tools_list(http, gw.url("a"), 2), 5)  # not the old fetch's 30 s
        release.set()
        await first
    assert second.status == 200 and (await fetch_counts(up_b)).get("tools/list") == 1


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize("change", ["removed", "changed"])
async def test_mcps_listening_clients_are_told_when_a_reload_removes_a_member_or_changes_what_it_answers(
    tmp_path: Path, serve: Any, counted: tuple[Upstream, Upstream], change: str
) -> None:
    up_a, up_b = counted
    config: dict[str, Any] = {"aggregate": {}, "upstreams": {"a": public(up_a), "b": public(up_b)}}
    gw = await serve(config)
    await wait_until(lambda: gw.app[REGISTRY].ready, what="every upstream probed once")
    b_now = {} if change == "removed" else {"b": public(up_b, headers={"X-T": "2"})}
    upstreams = {"a": public(up_a), **b_now}
    body = json.dumps(body_of("subscriptions/listen", {"notifications": {"toolsListChanged": True}}, id="l")).encode()
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{gw.base}/mcp", data=body, headers=mcp_headers("subscriptions/listen"))
        try:
            stream = Listening(resp)
            assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
            reloaded = {"admin": {"token": ADMIN_TOKEN}, **config, "upstreams": upstreams}
            (tmp_path / "gw.toml").write_text(dump_toml(reloaded))
            outcome = gw.app[RELOADER].reload()
            assert outcome.diff is not None and getattr(outcome.diff, change) == ("b",)
            await stream.next_of("notifications/tools/list_changed")
        finally:
            resp.close()
