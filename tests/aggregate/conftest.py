"""Fixtures and helpers of the tests of ``POST /mcp``, the fleet as one MCP server.

The members are the real SDK servers of ``tests/servers/`` (one process per test module; their
request counts and records are reset by each test that reads them) and, where a member has to
misbehave (hang, fail), a scripted :class:`~tests.support.FakeUpstream`. The gateway runs
in-process (``start_gateway``, registry probes off unless a test turns them on).

* ``public_up`` (conftest): member ``a`` of most tests; ``public_up_b``: a second process of the
  same server, so that the two share every tool, prompt and resource name, with ``ttlMs`` 30000
  (``a`` says 60000) so that the least TTL of a composed answer is visible.
* ``paged_up``: ``tests/servers/paged_upstream.py``, whose ``tools/list`` comes in 3 pages.
* :func:`agg`: one request to ``/mcp`` as a correct client writes it (routing headers from the
  body); :func:`post`: exact bytes and headers; :class:`Reply`: what came back.
* ``redis``: a real Redis of the test, for ``[cluster]``.
* Scripted members for the tests that attack ``/mcp`` are in :mod:`.scripted`.

The expectations are what docs/aggregate.md says ``/mcp`` does, written here from it, not read
from ``gateway.aggregate``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ..support import CLIENT_INFO_KEY, NAME_FIELD, RunningGateway, V, mcp_headers, wire
from ..support.fleet import Upstream, fetch_counts, reset_counts, run_server
from ..support.redis import RedisServer
from ..support.reply import Reply

SEP = "__"
CLIENT_INFO = {"name": "aggregate-tests", "version": "1.0.0"}
ELICIT_CAPS = {"elicitation": {"form": {}}}
CONFIRM_KEY = "_features:ask_confirmation"  # the inputRequests key of confirm_action's resolver
A_TTL_MS = 60_000  # public_up (the tests/servers default)
B_TTL_MS = 30_000  # public_up_b

#: What tests/servers/_features.py serves, in the order the SDK lists it.
FEATURE_TOOLS = ("add", "echo", "slow_progress", "confirm_action", "lookup")
FEATURE_PROMPTS = ("greet",)
FEATURE_RESOURCES = ("res://hello", "res://café")
FEATURE_TEMPLATES = ("res://items/{item_id}",)
#: tests/servers/paged_upstream.py
PAGED_TOOLS = tuple(f"paged_{i}" for i in range(1, 9))
PAGED_TOOL_CURSORS = [None, "page-2", "page-3"]

#: The list methods and the member of their result that holds the items.
LIST_KEYS = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}

#: The registry on, for the tests that need its probes or listen streams: probes about every 0.3 s
#: and quick retries, so the gateway's own listen streams are up within a second.
FAST_REGISTRY = {
    "probe_min_interval_s": 0.2,
    "probe_max_interval_s": 0.4,
    "probe_timeout_s": 3,
    "backoff_base_s": 0.1,
    "backoff_max_s": 0.4,
}

#: Bounds on the waits of these tests.
REQUEST_TIMEOUT_S = 20.0
MAX_PAGES = 200


# -- upstream processes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def public_up_b() -> Iterator[Upstream]:
    """A second ``public_upstream.py`` (same names as ``public_up``), ttlMs 30000."""
    with run_server("public_upstream", env={"UPSTREAM_TTL_MS": str(B_TTL_MS)}) as up:
        yield up


@pytest.fixture(scope="module")
def paged_up() -> Iterator[Upstream]:
    """``paged_upstream.py``: tools/list in 3 pages (3, 3, 2 tools), prompts/list in 3 pages."""
    with run_server("paged_upstream") as up:
        yield up


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real Redis of this test (as tests/cluster/conftest.py's ``redis_server``), for ``[cluster]``."""
    server = RedisServer(tmp_path / "redis")
    try:
        yield server
    finally:
        server.close()


async def reset(*ups: Upstream) -> None:
    for up in ups:
        await reset_counts(up)


async def count(up: Upstream, method: str) -> int:
    return (await fetch_counts(up)).get(method, 0)


# -- raw MCP over HTTP -----------------------------------------------------------------------------


def agg_url(gw: RunningGateway) -> str:
    return f"{gw.base_url}/mcp"


def body_of(
    method: str,
    params: dict[str, Any] | None = None,
    *,
    id: int | str = 1,
    caps: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    version: str = V,
) -> dict[str, Any]:
    """A modern request as an SDK client writes it, ``clientInfo`` in its ``_meta``."""
    more = {CLIENT_INFO_KEY: CLIENT_INFO, **(meta or {})}
    return wire.rpc(method, id, caps, more, version=version, **(params or {}))


async def post(
    http: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    *,
    http_method: str = "POST",
) -> Reply:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(REQUEST_TIMEOUT_S):
        async with http.request(http_method, url, data=body, headers=headers or {}) as resp:
            raw = await resp.read()
            return Reply(resp.status, resp.headers, raw, loop.time() - started)


async def agg(
    http: aiohttp.ClientSession,
    gw: RunningGateway | str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    headers: dict[str, str] | None = None,
    **body_kw: Any,
) -> Reply:
    """``method`` on ``/mcp`` of ``gw`` (or at the URL ``gw``), ``Mcp-Name`` the name or URI of
    the body; ``headers`` are added last and may replace any of them."""
    body = body_of(method, params, **body_kw)
    field = NAME_FIELD.get(method)
    name = params.get(field) if field is not None and params is not None else None
    hdrs = {**mcp_headers(method, name, version=body_kw.get("version", V)), **(headers or {})}
    target = gw if isinstance(gw, str) else agg_url(gw)
    return await post(http, target, json.dumps(body).encode(), hdrs)


async def list_pages(
    http: aiohttp.ClientSession, gw: RunningGateway, method: str, **body_kw: Any
) -> list[dict[str, Any]]:
    """Every page of an aggregate list, following the gateway's ``nextCursor`` (bounded)."""
    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        reply = await agg(http, gw, method, {} if cursor is None else {"cursor": cursor}, **body_kw)
        assert reply.status == 200, (reply.status, reply.raw)
        result = reply.result
        pages.append(result)
        cursor = result.get("nextCursor")
        if cursor is None:
            return pages
        assert isinstance(cursor, str) and cursor, result
    raise AssertionError(f"{method}: still a nextCursor after {MAX_PAGES} pages")


def items(pages: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    return [item for page in pages for item in page[LIST_KEYS[method]]]


def names(result: dict[str, Any], key: str = "tools") -> list[str]:
    return [item["name"] for item in result[key]]


def exposed(member: str, name: str) -> str:
    return f"{member}{SEP}{name}"


def exposed_uri(member: str, uri: str) -> str:
    return f"mcp-gateway:{member}/{uri}"


async def direct_list(http: aiohttp.ClientSession, up: Upstream, method: str) -> dict[str, Any]:
    """One page of ``method`` asked of the upstream itself (not through the gateway)."""
    reply = await agg(http, up.url, method)
    assert reply.status == 200, reply.raw
    return reply.result


async def eventually(condition: Callable[[], Awaitable[bool]], *, limit_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def aggregate_config(upstreams: dict[str, Any], aggregate: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """A config of these ``upstreams`` (name -> URL, an :class:`Upstream` or an upstream table)
    with ``[aggregate]`` (``aggregate`` its keys; every upstream a member unless it says)."""

    def table(u: Any) -> dict[str, Any]:
        if isinstance(u, Upstream):
            return {"url": u.url}
        return {"url": u} if isinstance(u, str) else dict(u)

    return {"upstreams": {n: table(u) for n, u in upstreams.items()}, "aggregate": aggregate or {}, **more}
