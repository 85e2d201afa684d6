"""What the reload tests share: two real SDK upstreams (``public_upstream``) for each module, and
the cluster tests' real Redis (``redis_server``) and replicas (``start_replicas``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..cluster.conftest import redis_server, start_replicas
from ..support.fleet import Upstream, reset_counts, run_server

__all__ = ["counted", "redis_server", "start_replicas", "up_a", "up_b"]


@pytest.fixture(scope="module")
def up_a() -> Iterator[Upstream]:
    with run_server("public_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def up_b() -> Iterator[Upstream]:
    with run_server("public_upstream") as up:
        yield up


@pytest.fixture
async def counted(up_a: Upstream, up_b: Upstream) -> tuple[Upstream, Upstream]:
    """The two upstreams, their counts and recorded requests cleared."""
    await reset_counts(up_a)
    await reset_counts(up_b)
    return up_a, up_b
