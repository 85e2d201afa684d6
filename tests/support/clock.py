"""Clocks the test moves by hand, for ``create_app(config, clock=..., sleep=...)`` and the cache's parts.

* :class:`FakeClock`: monotonic seconds, moved by :meth:`FakeClock.advance`.
* :class:`FakeTime`: a :class:`FakeClock` with a ``sleep`` that returns only when the clock has
  moved far enough, so the registry's pauses take no real time.
* :class:`RecordingSleep`: a ``sleep`` that only records the pauses asked for.
"""

from __future__ import annotations

import asyncio

from .polling import wait_until


class FakeClock:
    """Monotonic seconds that only move when :meth:`advance` is called (expiry without sleeping)."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeTime(FakeClock):
    """A :class:`FakeClock` with a ``sleep``, for ``create_app(clock=..., sleep=...)``: time moves
    only by :meth:`advance`.

    ``sleep(s)`` returns once the clock has moved ``s`` seconds past the call. A test first waits
    until the code is asleep (:meth:`asleep`), then moves time, so no pause is missed.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sleepers: list[tuple[float, float, asyncio.Future[None]]] = []

    async def sleep(self, seconds: float) -> None:
        entry = (self.now + seconds, seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[2]
        finally:
            self._sleepers.remove(entry)

    async def asleep(self, seconds: float) -> None:
        """Until some task sleeps for exactly ``seconds`` (polled, bounded like :func:`wait_until`)."""
        await wait_until(
            lambda: any(s == seconds and not f.done() for _, s, f in self._sleepers), what=f"a sleep of {seconds} s"
        )

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds`` and end every sleep that is then due."""
        super().advance(seconds)
        for due, _, fut in self._sleepers:
            if due <= self.now and not fut.done():
                fut.set_result(None)


class RecordingSleep:
    """A fake ``sleep`` that records each delay in ``delays`` and returns at once; the
    ``park_after``-th call sets ``enough`` and never returns (its caller waits until cancelled)."""

    def __init__(self, *, park_after: int) -> None:
        self.delays: list[float] = []
        self.enough = asyncio.Event()
        self._park_after = park_after

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if len(self.delays) >= self._park_after:
            self.enough.set()
            await asyncio.Event().wait()  # park the caller until shutdown
        await asyncio.sleep(0)
