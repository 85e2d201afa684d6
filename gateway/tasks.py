"""Background tasks that the app starts and stops from its ``cleanup_ctx``."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Coroutine
from typing import Any, Final

__all__ = ["CLOSE_TIMEOUT_S", "BackgroundTasks", "cancel_requested"]

#: How long :meth:`BackgroundTasks.close` waits for cancelled tasks to end, in seconds: a task
#: stuck in a client library that does not give way to cancellation must not hold the shutdown.
CLOSE_TIMEOUT_S: Final = 5.0


def cancel_requested() -> bool:
    """Whether the running task has been asked to cancel and has not taken it back.

    An ``except`` that catches a library's errors checks it: a client library that turns the
    ``CancelledError`` it received into one of its own errors (a timeout, a lost connection)
    would otherwise leave a retry loop running for good, however often it is cancelled
    (``asyncio.Task.cancelling``: ``asyncio.timeout`` takes its own cancellation back, so a
    real timeout reads ``False``)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class BackgroundTasks:
    """Owns a set of background tasks (probes, listen streams, any other background work).

    The event loop keeps only weak references to tasks, so this keeps strong ones until each
    task ends; :meth:`close` cancels every task and awaits them all. A task that dies of an
    unexpected exception is logged to ``log``, never silently lost. The owner passes its own
    logger so that the report names the part of the gateway that lost the task.
    """

    def __init__(self, log: logging.Logger | None = None) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = log if log is not None else logging.getLogger("mcp_gateway.tasks")

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run ``coro`` as a task called ``name`` and keep it until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._log.error("background task %s died", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task and wait until all have ended, at most :data:`CLOSE_TIMEOUT_S`
        (those still running then are named in a warning and left to the loop's end)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            if pending:
                names = ", ".join(sorted(t.get_name() for t in pending))
                self._log.warning(
                    "%d background tasks did not end within %g s of shutdown: %s", len(pending), CLOSE_TIMEOUT_S, names
                )
                for task in pending:  # where each one is stuck: what a fix needs
                    where = io.StringIO()
                    task.print_stack(limit=12, file=where)
                    self._log.warning("%s", where.getvalue().rstrip())
        self._tasks.clear()
