"""The queue budget of gateway.proxy.writing, without a socket (the writer itself is exercised
by tests/proxy/test_slow_callers.py against real connections)."""

from __future__ import annotations

import asyncio

from gateway.proxy.writing import QueueBudget


async def settle() -> None:
    """Let every task that can run, run (no time passes: the budget is all there is to wait on)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_the_queue_budget_never_grants_more_than_its_limit_and_serves_waiters_in_order() -> None:
    budget = QueueBudget(100)
    await budget.acquire(60)
    granted: list[str] = []

    async def take(name: str, size: int) -> None:
        await budget.acquire(size)
        granted.append(name)

    first = asyncio.ensure_future(take("first", 50))
    second = asyncio.ensure_future(take("second", 10))  # would fit, but waits its turn
    await settle()
    assert granted == [] and budget.queued == 60
    budget.release(60)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert granted == ["first", "second"] and budget.queued == 60


async def test_a_writer_that_gives_up_waiting_for_room_lets_the_next_one_in() -> None:
    budget = QueueBudget(100)
    await budget.acquire(90)
    big = asyncio.ensure_future(budget.acquire(50))
    small = asyncio.ensure_future(budget.acquire(10))
    await settle()
    assert not big.done() and not small.done()
    big.cancel()  # its deadline passed
    await asyncio.wait_for(small, 5)
    assert budget.queued == 100
    budget.release(10)
    budget.release(90)
    assert budget.queued == 0


async def test_a_waiter_cancelled_just_before_room_is_released_is_neither_granted_nor_an_error() -> None:
    """A caller that goes away while waiting for room, in the same turn as room is given back:
    it gets nothing, it raises only its cancellation, and the room stays free."""
    budget = QueueBudget(65536)
    await budget.acquire(65536)
    waiting = asyncio.ensure_future(budget.acquire(65536))
    await settle()
    waiting.cancel()
    budget.release(65536)
    try:
        await waiting
    except asyncio.CancelledError:
        pass
    assert budget.queued == 0
    await asyncio.wait_for(budget.acquire(65536), 5)  # the room is there for the next one
    assert budget.queued == 65536
