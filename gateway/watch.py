"""``serve --watch``: a reload when the config file, or a ``${file:PATH}`` secret it reads, changes.

The directories holding them are watched (``watchfiles``: inotify on Linux), not the files: an
editor that saves by renaming a new file over the old one, and a Kubernetes ConfigMap or Secret
update, which writes a new directory and renames a ``..data`` symlink over the old one, leave
the file's own watch on a file that is gone. Every change in those directories (debounced:
:data:`DEBOUNCE_MS`) makes the files be read again, and only when their bytes differ from the
last ones seen is ``on_change`` called: a change next to them (another file, the old ConfigMap
directory removed) reloads nothing. The secrets a config reads are found again after each change.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

import watchfiles
from aiohttp import web

from .config import secret_files
from .config.load import MAX_CONFIG_BYTES, MAX_SECRET_BYTES, read_regular

__all__ = ["DEBOUNCE_MS", "ConfigWatch", "reloading_on_change"]

log = logging.getLogger("mcp_gateway.watch")

#: The longest changes are gathered into one before the files are read again, in milliseconds
#: (``watchfiles`` ends a batch sooner once 50 ms pass with no change: a save or a ConfigMap swap
#: is read ~0.1 s after it).
DEBOUNCE_MS: Final = 500


def _digest(paths: tuple[Path, ...]) -> tuple[str | None, ...]:
    """The SHA-256 of each file's bytes (symlinks followed), ``None`` for one that cannot be read
    as a reload reads it (a regular file within its bound: a FIFO would hold the watch for good)."""
    out: list[str | None] = []
    for i, path in enumerate(paths):
        try:
            data = read_regular(path, MAX_CONFIG_BYTES if i == 0 else MAX_SECRET_BYTES)
        except OSError:
            out.append(None)
        else:
            out.append(hashlib.sha256(data).hexdigest())
    return tuple(out)


class ConfigWatch:
    """Calls ``on_change()`` (from its own thread) when the config at ``path`` or a secret it reads
    changes (see the module), from :meth:`start` to :meth:`stop`."""

    def __init__(self, path: str | Path, on_change: Callable[[], object]) -> None:
        self.path = Path(path)
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._files, self._seen = self._read()

    def _read(self) -> tuple[tuple[Path, ...], tuple[str | None, ...]]:
        files = (self.path, *secret_files(self.path))
        return files, _digest(files)

    def _directories(self) -> set[Path]:
        # Each file's directory as named, and its target's once symlinks are followed (a
        # ConfigMap's file is a symlink into ..data, which the first directory holds).
        dirs: set[Path] = set()
        for file in self._files:
            dirs.add(file.absolute().parent)
            dirs.add(file.resolve().parent)
        return {d for d in dirs if d.is_dir()}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mcp-gateway-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; returns once the thread has ended (within ``watchfiles``' step, 50 ms)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            dirs = self._directories()
            log.info("watching %s for config changes", ", ".join(sorted(map(str, dirs))))
            try:
                self._watch(dirs)
            except Exception:  # a directory gone, the inotify limit reached: try again
                log.exception("watching the config failed; trying again in 1 s")
                self._stop.wait(1.0)

    def _watch(self, dirs: set[Path]) -> None:
        for _changes in watchfiles.watch(
            *dirs,
            watch_filter=None,  # every change: the bytes decide (see the module)
            debounce=DEBOUNCE_MS,
            stop_event=self._stop,
            recursive=False,
            raise_interrupt=False,
        ):
            files, seen = self._read()
            if seen != self._seen:
                self._seen = seen
                log.info("config changed on disk: reloading")
                self._on_change()
            # Other secrets, or a symlink pointed into another directory: watch those instead.
            moved = files != self._files
            self._files = files
            if moved or self._directories() != dirs:
                return


def reloading_on_change(
    path: str | Path, reload: Callable[[], object]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` of one gateway process (``serve --watch`` without ``--workers``): while
    the app runs, a change to ``path`` (see :class:`ConfigWatch`) calls ``reload()`` on its loop."""

    async def watching(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        watch = ConfigWatch(path, lambda: loop.call_soon_threadsafe(reload))
        watch.start()
        yield
        await asyncio.to_thread(watch.stop)

    return watching
