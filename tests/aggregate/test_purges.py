"""``POST /mcp`` against purges that cross answers in flight: an admin purge (as a
``list_changed`` notification would) while a member's list is on its way, on its own route or as
a part of a composition.

What must hold: the caller in flight gets what was read, but nothing read before the purge is
stored, composed from or answered afterwards, on either route.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ..support import StartGateway, StartUpstream
from .conftest import agg, aggregate_config, names
from .scripted import ADMIN, purge, result_of, tools_result

pytestmark = pytest.mark.timeout(60)


async def test_an_answer_in_flight_across_a_purge_is_not_what_mcp_composes_afterwards(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # A purge (POST /admin/cache/purge, or a list_changed notification) while a per-upstream
    # tools/list of m is in flight: m read its list before the change, and answers after the
    # purge. That answer must not be stored by the per-upstream route (as refresh-ahead and /mcp's
    # own parts do not store one), or the next /mcp list would be composed from the list the purge
    # was meant to remove, as a hit ("detail=composed"), for the entry's whole ttlMs.
    up = await start_upstream()
    listed = {"now": "old"}
    arrived, release = asyncio.Event(), asyncio.Event()

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        snapshot = listed["now"]  # what m lists when the request arrives
        if not release.is_set():
            arrived.set()
            await release.wait()
        return result_of(msg, tools_result(snapshot))

    up.handlers["tools/list"] = answer
    gw = await start_gateway(aggregate_config({"m": up.url}, admin={"token": ADMIN}))
    in_flight = asyncio.create_task(agg(http, gw.url("m"), "tools/list"))
    async with asyncio.timeout(5):
        await arrived.wait()
    listed["now"] = "new"  # m's list changes ...
    await purge(http, gw, upstream="m")  # ... and the operator purges m
    release.set()
    assert names((await in_flight).result) == ["old"]  # it was in flight: its caller gets it
    after = await agg(http, gw, "tools/list")
    assert names(after.result) == ["m__new"], (after.cache_status, after.raw)


async def test_a_purge_while_a_composition_is_in_flight_is_never_undone_by_it(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Member s is slow; member f's part comes from the cache. A purge of f and of s (an admin
    # purge, as a notification would) while /mcp waits for s: the caller in flight gets what was
    # read, but nothing it read before the purge is stored or answered afterwards.
    listed = {"f": "f1", "s": "s1"}
    arrived, release = asyncio.Event(), asyncio.Event()
    f, s = await start_upstream(), await start_upstream()

    async def fast(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(listed["f"]))

    async def slow(request: web.Request, msg: Any) -> web.StreamResponse:
        snapshot = listed["s"]
        if not release.is_set():
            arrived.set()
            await release.wait()
        return result_of(msg, tools_result(snapshot))

    f.handlers["tools/list"], s.handlers["tools/list"] = fast, slow
    gw = await start_gateway(aggregate_config({"f": f.url, "s": s.url}, admin={"token": ADMIN}))
    assert (await agg(http, gw.url("f"), "tools/list")).status == 200
    in_flight = asyncio.create_task(agg(http, gw, "tools/list"))
    async with asyncio.timeout(5):
        await arrived.wait()
    listed.update(f="f2", s="s2")
    await purge(http, gw, upstream="f")
    await purge(http, gw, upstream="s")
    release.set()
    assert names((await in_flight).result) == ["f__f1", "s__s1"]
    after = await agg(http, gw, "tools/list")
    assert names(after.result) == ["f__f2", "s__s2"] and not after.cache_hit, after.cache_status
