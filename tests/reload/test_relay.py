"""Config reload across a ``serve --workers 2`` group (gateway.relay): ``SIGHUP`` to the parent
and ``POST /admin/reload`` on one worker reload every worker; an invalid file changes none.

A real ``mcp-gateway serve --workers 2`` (tests/support/replicas.py) in front of real SDK upstreams;
the registry is off, so only the test's requests reach them. Each worker has its own cache: the
first ``tools/list`` a worker answers for an upstream is that upstream's, the next ones are hits,
so the upstream's count of ``tools/list`` is how many workers served it. Requests that must reach
either worker go on new connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ..support.fleet import Upstream, fetch_counts
from ..support.polling import wait_until
from ..support.reloading import admin_reload, public, rewrite, steady_load, tools_list
from ..support.replicas import Replicas

pytestmark = pytest.mark.timeout(120)

#: How soon every worker serves a reloaded config, in seconds (a reload takes milliseconds).
RELOADED_WITHIN_S = 2.0


@contextlib.asynccontextmanager
async def group(tmp_path: Path, config: Mapping[str, Any], *more_args: str) -> AsyncIterator[Replicas]:
    """``mcp-gateway serve --workers 2`` of ``config`` (``[admin]`` added, the registry off)."""
    gw = Replicas({"registry": {"enabled": False}, **config}, 1, tmp_path, extra_args=("--workers", "2", *more_args))
    try:
        await gw.start_all()
        # Both workers' apps started: a reload asked earlier is done once more by a worker still
        # starting (the one it noted, then the relayed one), which would miscount the reloads.
        await wait_until(lambda: gw.log(0).count("Running on") == 2, what="both workers serving")
        yield gw
    finally:
        await gw.close()


@contextlib.asynccontextmanager
async def new_connections() -> AsyncIterator[aiohttp.ClientSession]:
    """A session whose every request is on a new connection, which either worker may accept."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


async def served_by_both_workers(gw: Replicas, name: str, up: Upstream, *, limit_s: float) -> None:
    """Send ``tools/list`` to upstream ``name`` on new connections until both workers have
    answered it (``up`` counted two), within ``limit_s``; then 20 more, every one answered."""
    async with new_connections() as http:

        async def both() -> bool:
            await tools_list(http, gw.url(0, name))
            return (await fetch_counts(up)).get("tools/list", 0) >= 2

        await wait_until(both, limit_s=limit_s, what=f"both workers to serve {name}")
        replies = [await tools_list(http, gw.url(0, name), i) for i in range(20)]
    assert [r.status for r in replies] == [200] * 20


def config_info(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    return {dict(labels)["sha256"]: v for (n, labels), v in samples.items() if n == "mcp_gateway_config_info"}


def reloads(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], outcome: str) -> float:
    return samples.get(("mcp_gateway_config_reloads_total", (("outcome", outcome),)), 0.0)


async def test_sighup_to_the_parent_reloads_both_workers_and_the_other_upstreams_lose_no_request(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    async with group(tmp_path, {"upstreams": {"a": public(up_a)}}) as gw:
        before = gw[0].config_path.read_bytes()
        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(http, [gw.url(0, "a")], stop, most=500))
        try:
            sha = rewrite(gw, {"registry": {"enabled": False}, "upstreams": {"a": public(up_a), "b": public(up_b)}})
            assert gw[0].process is not None
            os.kill(gw[0].process.pid, signal.SIGHUP)
            await served_by_both_workers(gw, "b", up_b, limit_s=RELOADED_WITHIN_S)
        finally:
            stop.set()
            sent, failures = await load
        assert gw[0].running, "the parent died of SIGHUP"
        assert (sent, failures) == (sent, []) and sent > 0
        samples = await gw.metrics(0)
        assert reloads(samples, "ok") == 2 and reloads(samples, "failed") == 0  # summed over the two
        # livemax over the workers: the new config served, the old one by nobody any more.
        old = hashlib.sha256(before).hexdigest()
        assert config_info(samples) == {old: 0.0, sha: 1.0}
        assert "exited with" not in gw.log(0)


async def test_admin_reload_on_one_worker_reloads_the_other_too(
    tmp_path: Path, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    async with group(tmp_path, {"upstreams": {"a": public(up_a)}}) as gw, new_connections() as http:
        sha = rewrite(gw, {"registry": {"enabled": False}, "upstreams": {"a": public(up_a), "b": public(up_b)}})
        status, body = await admin_reload(http, gw)
        assert (status, body["reloaded"], body["added"], body["config_sha256"]) == (200, True, ["b"], sha)
        await served_by_both_workers(gw, "b", up_b, limit_s=RELOADED_WITHIN_S)

        async def each_reloaded_once() -> bool:
            return reloads(await gw.metrics(0), "ok") == 2

        await wait_until(each_reloaded_once, limit_s=RELOADED_WITHIN_S, what="one reload in each worker")
        assert "reloaded the config (POST /admin/reload): the others reload too" in gw.log(0)


async def test_an_invalid_file_is_a_400_and_every_worker_keeps_serving_the_old_config(
    tmp_path: Path, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, _ = counted
    async with group(tmp_path, {"upstreams": {"a": public(up_a)}}) as gw, new_connections() as http:
        old = hashlib.sha256(gw[0].config_path.read_bytes()).hexdigest()
        rewrite(gw, {"upstreams": {"a": {**public(up_a), "timeout_s": "soon"}}})
        status, body = await admin_reload(http, gw)
        assert (status, body["reloaded"], body["config_sha256"]) == (400, False, old)
        assert "upstreams.a.timeout_s" in body["error"]

        async def both_failed() -> bool:
            return reloads(await gw.metrics(0), "failed") == 2

        await wait_until(both_failed, limit_s=RELOADED_WITHIN_S, what="the other worker to try and fail too")
        samples = await gw.metrics(0)
        assert reloads(samples, "ok") == 0 and config_info(samples) == {old: 1.0}
        await served_by_both_workers(gw, "a", up_a, limit_s=10)  # both still serve a


async def test_a_removed_upstreams_gauges_leave_the_groups_scrape(
    tmp_path: Path, counted: tuple[Upstream, Upstream]
) -> None:
    # The multiprocess files cannot drop a series: without care, a removed upstream's gauges
    # (its in-flight count, its health: MCPGatewayUpstreamDown) would read on until a restart.
    up_a, up_b = counted
    quiet = {"registry": {"enabled": False}}
    async with group(tmp_path, {**quiet, "upstreams": {"a": public(up_a), "b": public(up_b)}}) as gw:

        def gauged(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
            inflight = "mcp_gateway_inflight_requests"
            return {dict(labels)["upstream"] for (name, labels), _ in samples.items() if name == inflight}

        assert gauged(await gw.metrics(0)) == {"a", "b"}
        rewrite(gw, {**quiet, "upstreams": {"a": public(up_a)}})
        assert gw[0].process is not None
        os.kill(gw[0].process.pid, signal.SIGHUP)

        async def reloaded() -> bool:
            return reloads(await gw.metrics(0), "ok") == 2

        await wait_until(reloaded, limit_s=RELOADED_WITHIN_S, what="one reload in each worker")
        for _ in range(6):  # a scrape reaches either worker
            assert gauged(await gw.metrics(0)) == {"a"}
