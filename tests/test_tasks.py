"""``BackgroundTasks``: what the app's shutdown waits for."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gateway import tasks
from gateway.tasks import BackgroundTasks


async def test_close_cancels_every_task_and_waits_for_it() -> None:
    owner = BackgroundTasks()
    ended: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append("forever")

    owner.spawn(forever(), name="forever")
    await asyncio.sleep(0)
    await owner.close()
    assert ended == ["forever"] and len(owner) == 0


async def test_a_task_that_ignores_cancellation_does_not_hold_the_shutdown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # As a client library stuck on a socket may: the shutdown goes on after CLOSE_TIMEOUT_S.
    monkeypatch.setattr(tasks, "CLOSE_TIMEOUT_S", 0.2)
    owner = BackgroundTasks(logging.getLogger("test.tasks"))
    stop = asyncio.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # swallowed

    task = owner.spawn(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="test.tasks"):
        await owner.close()
    assert time.monotonic() - started < 2
    assert any("did not end" in r.getMessage() and "stubborn" in r.getMessage() for r in caplog.records)
    # Where it is stuck, for whoever fixes it: its stack, down to the line that swallowed.
    assert any("Stack for" in r.getMessage() and "in stubborn" in r.getMessage() for r in caplog.records)
    stop.set()
    task.cancel()
    await asyncio.wait([task], timeout=1)
