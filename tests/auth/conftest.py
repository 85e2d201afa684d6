"""Fixtures of the auth tests: the fixture identity provider (``idp``, tests/support/idp.py),
started on 127.0.0.1 for each test and stopped at its end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ..support.idp import FixtureIdp


@pytest.fixture
async def idp() -> AsyncIterator[FixtureIdp]:
    provider = FixtureIdp()
    await provider.start()
    yield provider
    await provider.stop()


@pytest.fixture
def short_fetches(monkeypatch: pytest.MonkeyPatch) -> float:
    """The identity provider's requests time out after 1.5 s (not 5): a slow IdP test stays short."""
    monkeypatch.setattr("gateway.auth.fetch.FETCH_TIMEOUT_S", 1.5)
    return 1.5
