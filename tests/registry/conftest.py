"""Fixtures of the registry tests: servers started by a test, an HTTP client, real SDK and legacy upstreams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from ..support.fleet import Upstream, run_legacy_server, run_server
from .harness import Servers, legacy_venv_or_skip


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    s = Servers()
    yield s
    for server in reversed(s.running):
        await server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="module")
def public_up() -> Iterator[Upstream]:
    with run_server("public_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def changing_up() -> Iterator[Upstream]:
    with run_server("changing_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def legacy_up() -> Iterator[Upstream]:
    legacy_venv_or_skip()
    with run_legacy_server() as up:
        yield up
