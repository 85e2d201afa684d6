"""Fixtures shared by the test modules (the helpers they use are in ``tests/support/``).

* ``fake_clock``: a :class:`~tests.support.FakeClock` for ``create_app(config, clock=...)``.
* ``http``: an ``aiohttp.ClientSession`` without a connection limit (for concurrent callers).
* ``start_gateway``: starts the gateway in-process on 127.0.0.1 from a config dict and
  stops it at the end of the test.
* ``start_upstream``: serves a :class:`~tests.support.FakeUpstream` whose answers the test writes.
* ``public_up``, ``private_up``, ``changing_up``: the real SDK servers of ``tests/servers/``
  (``public_upstream.py`` and so on), one process per test module (each takes a second to start).
* ``authserver``: a real OAuth authorization server (``tests/support/authserver.py``), one
  process per test module; its log is added to the report of a test that fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.cache import Clock
from gateway.config import parse_config

from .support import FakeClock, FakeUpstream, Handler, RunningGateway, StartGateway, StartUpstream
from .support.authserver import AuthServer, run_authserver
from .support.authserver import tools_available as authserver_available
from .support.fleet import Upstream, run_server

#: The authorization server a test used, so that its log can join the test's failure report.
_AUTHSERVER = pytest.StashKey[AuthServer]()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    """``await start_gateway(config_dict, clock=None)`` -> :class:`RunningGateway`."""
    servers: list[TestServer] = []

    async def start(config: Mapping[str, Any], *, clock: Clock | None = None) -> RunningGateway:
        registry = CollectorRegistry()
        kwargs: dict[str, Any] = {"metrics_registry": registry}
        if clock is not None:
            kwargs["clock"] = clock
        # The end-to-end tests count upstream requests exactly, so registry probes are off
        # unless a test asks for them (the registry has its own tests).
        app = create_app(parse_config({"registry": {"enabled": False}, **config}), **kwargs)
        server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
        await server.start_server()
        servers.append(server)
        return RunningGateway(server, app, registry)

    yield start
    for server in reversed(servers):
        await server.close()


@pytest.fixture
def start_upstream(aiohttp_server: Any) -> StartUpstream:
    """``await start_upstream(answer=None)`` -> a served :class:`FakeUpstream` (its ``url`` set);
    ``answer`` answers what its ``handlers`` do not name (default: a public tools list)."""

    async def start(answer: Handler | None = None) -> FakeUpstream:
        upstream = FakeUpstream() if answer is None else FakeUpstream(answer)
        server: TestServer = await aiohttp_server(upstream.app())
        upstream.url = str(server.make_url("/mcp"))
        return upstream

    return start


@pytest.fixture(scope="module")
def public_up() -> Iterator[Upstream]:
    """``public_upstream.py``: every cacheable answer public (ttlMs 60000)."""
    with run_server("public_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def private_up() -> Iterator[Upstream]:
    """``private_upstream.py``: every cacheable answer private."""
    with run_server("private_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def changing_up() -> Iterator[Upstream]:
    """``changing_upstream.py``: adds a tool or changes ``res://counter`` when asked, and notifies."""
    with run_server("changing_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def _authserver_process() -> Iterator[AuthServer]:
    assert authserver_available(), "oidc-provider missing: run scripts/install-tools.sh (make test does)"
    with run_authserver() as server:
        yield server


@pytest.fixture
def authserver(_authserver_process: AuthServer, request: pytest.FixtureRequest) -> AuthServer:
    """``tests/support/oidc/provider.mjs`` (oidc-provider): JWT access tokens, accounts engineer and ci."""
    request.node.stash[_AUTHSERVER] = _authserver_process
    return _authserver_process


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    server = item.stash.get(_AUTHSERVER, None)
    if server is not None and report.failed:
        report.sections.append(("oidc-provider log", server.log()))
    return report
