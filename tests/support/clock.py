"""A clock the test moves by hand, for ``create_app(config, clock=...)`` and the cache's parts."""

from __future__ import annotations


class FakeClock:
    """Monotonic seconds that only move when :meth:`advance` is called (expiry without sleeping)."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
