"""Waiting for background work to reach a promised state: poll it, bounded in time, never a fixed sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def wait_until(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool], *, limit_s: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``condition`` (sync or async) every 20 ms until it is true.

    Raises :class:`AssertionError` naming ``what`` after ``limit_s`` seconds (wall clock).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        outcome = condition()
        if isinstance(outcome, Awaitable):
            outcome = await outcome
        if outcome:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}")
        await asyncio.sleep(0.02)
