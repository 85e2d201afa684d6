"""A config reload across a ``serve --workers N`` group: every worker reloads its own copy.

The parent holds no config of its own to reload: ``SIGHUP`` to it is passed on to every worker
(each reads the file itself, :mod:`gateway.reload`), and the parent neither dies nor restarts
anyone. ``POST /admin/reload`` on one worker reloads that worker (its answer says what it did),
then :meth:`GroupReload.request` writes the worker's pid to a pipe the parent made before the
fork and sends the parent ``SIGUSR1``; the parent sends ``SIGHUP`` to every other worker.

Why signals through the parent and not the workers' datagram bus (:mod:`gateway.cluster.workers`):
the parent already knows every worker, ``SIGHUP`` to it and ``serve --watch`` (the parent watches
the file) take the same path, and a signal stays pending for a worker that is busy, where a
datagram to a worker whose buffer is full is lost. Signals of one kind coalesce: two reloads
asked together may be one, which reads the newest file, so nothing is missed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import struct
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from aiohttp import web

from .watch import ConfigWatch

__all__ = ["EarlyHangup", "GroupReload"]

log = logging.getLogger("mcp_gateway")

_PID: Final = struct.Struct("=i")  # under PIPE_BUF: one write is never split


class GroupReload:
    """The parent's and the workers' ends of a group reload (see the module). Made in the parent
    before it forks; :meth:`in_parent` there once the workers are forked, :meth:`in_worker` in
    each worker after its fork, :meth:`close` in the parent at the end. ``watch``: the config
    file the parent watches (``serve --watch``, :mod:`gateway.watch`), a change a ``SIGHUP``."""

    def __init__(self, watch: str | None = None) -> None:
        self.parent_pid = os.getpid()
        self._watch_path = watch
        self._watch: ConfigWatch | None = None
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._workers: Iterable[int] = ()
        self._missed = False

    def install(self, workers: Iterable[int]) -> None:
        """In the parent, before the first fork (a reload asked at once must not find the default
        action, which ends the process): ``SIGHUP`` and ``SIGUSR1`` handlers over ``workers``
        (the live pids, read at each signal)."""
        self._workers = workers
        signal.signal(signal.SIGHUP, self._on_sighup)
        signal.signal(signal.SIGUSR1, self._on_request)

    def in_worker(self) -> None:
        """In a worker, just after its fork: the parent's handlers undone. A ``SIGHUP`` before
        the worker's app handles it (:func:`gateway.app.reload_on_sighup`) is noted, and the
        reload done once it does (:meth:`after_start`): the default action would end the worker,
        and ignoring it would leave the worker on the config the parent read at start."""
        os.close(self._read)
        signal.signal(signal.SIGHUP, self._note)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    def _note(self, _signum: int, _frame: object) -> None:
        self._missed = True

    def after_start(self, reload: Callable[[], object]) -> Callable[[web.Application], Awaitable[None]]:
        """An ``on_startup`` hook of a worker's app, after :func:`gateway.app.reload_on_sighup`:
        ``reload()`` if a ``SIGHUP`` came before that."""

        async def catch_up(app: web.Application) -> None:
            if self._missed:
                self._missed = False
                reload()

        return catch_up

    def in_parent(self) -> None:
        """In the parent once every worker is forked: only the workers write to the pipe; the
        watch starts (a thread: after the forks)."""
        os.close(self._write)
        if self._watch_path is not None:
            self._watch = ConfigWatch(self._watch_path, lambda: os.kill(self.parent_pid, signal.SIGHUP))
            self._watch.start()

    def close(self) -> None:
        """In the parent, the workers gone: the watch stops, the pipe closes."""
        if self._watch is not None:
            self._watch.stop()
        os.close(self._read)

    def request(self) -> None:
        """In a worker that has just reloaded: have the parent send ``SIGHUP`` to the others
        (returns at once). A parent that is gone is logged, not raised: the reload here stands."""
        if os.getppid() != self.parent_pid:
            log.error("config reload: the parent process is gone; the other workers did not reload")
            return
        try:
            os.write(self._write, _PID.pack(os.getpid()))
        except BlockingIOError:  # the parent has 16k requests unread: it is not running
            log.error("config reload: the parent is not reading; the other workers did not reload")
            return
        os.kill(self.parent_pid, signal.SIGUSR1)

    def _send(self, skip: frozenset[int] = frozenset()) -> None:
        for pid in list(self._workers):
            if pid not in skip:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGHUP)

    def _on_sighup(self, _signum: int, _frame: object) -> None:
        log.info("SIGHUP: every worker reloads the config")
        self._send()

    def _on_request(self, _signum: int, _frame: object) -> None:
        try:
            data = os.read(self._read, 4096 * _PID.size)
        except BlockingIOError:
            return
        asked = [pid for (pid,) in _PID.iter_unpack(data[: len(data) - len(data) % _PID.size])]
        for pid in dict.fromkeys(asked):
            log.info("worker pid %d reloaded the config (POST /admin/reload): the others reload too", pid)
            self._send(frozenset((pid,)))


class EarlyHangup:
    """One process: a ``SIGHUP`` before the app handles it (:func:`gateway.app.reload_on_sighup`)
    is noted from now on, and the reload done once it does (:meth:`after_start`): the default
    action would end the process, and ignoring it would leave it on the config read at start."""

    def __init__(self) -> None:
        self._missed = False
        signal.signal(signal.SIGHUP, self._note)

    def _note(self, _signum: int, _frame: object) -> None:
        self._missed = True

    def after_start(self, reload: Callable[[], object]) -> Callable[[web.Application], Awaitable[None]]:
        """An ``on_startup`` hook, after :func:`gateway.app.reload_on_sighup`."""

        async def catch_up(app: web.Application) -> None:
            if self._missed:
                self._missed = False
                reload()

        return catch_up
