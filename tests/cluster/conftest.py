"""Fixtures of the cluster tests: a real Redis and real gateway processes as replicas.

* ``redis_server``: a :class:`~tests.support.redis.RedisServer` of this test (a free port,
  persistence off), killed at its end.
* ``start_replicas``: ``await start_replicas(config, count=3)`` -> started
  :class:`~tests.support.replicas.Replicas`, all stopped at the end of the test.

When a test fails, the end of every replica's log and of Redis's log is added to its report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ..support.redis import RedisServer
from ..support.replicas import Replicas

StartReplicas = Callable[..., Awaitable[Replicas]]
_LOGGED = pytest.StashKey[list[Callable[[], str]]]()
REDIS_LOG_TAIL = 4000


def _logged(request: pytest.FixtureRequest) -> list[Callable[[], str]]:
    item = request.node
    if _LOGGED not in item.stash:
        item.stash[_LOGGED] = []
    return item.stash[_LOGGED]


@pytest.fixture
def redis_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    _logged(request).append(lambda: f"----- redis-server ({server.url}) -----\n{server.log()[-REDIS_LOG_TAIL:]}")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def start_replicas(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[StartReplicas]:
    """``await start_replicas(config, count=3, name="replica", **kwargs)`` (see ``Replicas``)."""
    started: list[Replicas] = []

    async def start(config: Mapping[str, Any], count: int = 3, *, name: str = "replica", **kwargs: Any) -> Replicas:
        replicas = Replicas(config, count, tmp_path / "replicas", name=name, **kwargs)
        started.append(replicas)
        _logged(request).append(replicas.logs)
        await replicas.start_all()
        return replicas

    try:
        yield start
    finally:
        for replicas in started:
            await replicas.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.failed and _LOGGED in item.stash:
        for logs in item.stash[_LOGGED]:
            try:
                report.sections.append(("cluster logs", logs()))
            except Exception as exc:  # a report must never fail for want of a log
                report.sections.append(("cluster logs", f"(log unreadable: {exc!r})"))
    return report
