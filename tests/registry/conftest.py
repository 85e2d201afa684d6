"""Fixtures of the registry tests: servers started by a test and a legacy-only upstream (the HTTP
client and the real SDK upstreams, ``public_up`` and ``changing_up``, are tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from ..support.fleet import Upstream, run_legacy_server
from .harness import Servers, legacy_venv_or_skip


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    s = Servers()
    yield s
    for server in reversed(s.running):
        await server.close()


@pytest.fixture(scope="module")
def legacy_up() -> Iterator[Upstream]:
    legacy_venv_or_skip()
    with run_legacy_server() as up:
        yield up
