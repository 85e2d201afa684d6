"""Invalidation between the worker processes of one ``serve --workers N`` without ``[cluster]``.

Each worker binds a Unix datagram socket ``<dir>/bus-<pid>.sock`` in a directory the parent
made for the group; an invalidation (a purge, a listen-stream notification) is sent as one JSON
datagram to every other socket there, and each receiver drops the matching entries from its own
cache. Local datagrams are not lost while the receiver keeps reading; a receiver whose buffer is
full (it stalled) misses the message and is told so in the log, and its entries then live out
their ``ttlMs``. With ``[cluster]``, Redis does this job instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ..cache import Invalidation
from ..codec import dumps, loads

__all__ = ["WorkerBus"]

log = logging.getLogger("mcp_gateway.workers")

_PREFIX: Final = "bus-"


class WorkerBus:
    """This worker's end of the group's bus in ``directory``. ``on_invalidation(invalidation,
    reason)`` runs for each message another worker sent."""

    def __init__(self, directory: str | Path, on_invalidation: Callable[[Invalidation, str], object]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / f"{_PREFIX}{os.getpid()}.sock"
        self._on_invalidation = on_invalidation
        self._sock: socket.socket | None = None

    def start(self) -> None:
        """Bind this worker's socket and start reading it."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        self.path.unlink(missing_ok=True)
        sock.bind(str(self.path))
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def stop(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        self.path.unlink(missing_ok=True)

    def broadcast(self, invalidation: Invalidation, reason: str) -> None:
        """Send ``invalidation`` to every other worker of the group (never blocks)."""
        if self._sock is None:
            return
        message = dumps({"invalidation": invalidation.to_json(), "reason": reason})
        for peer in self.directory.glob(f"{_PREFIX}*.sock"):
            if peer == self.path:
                continue
            try:
                self._sock.sendto(message, str(peer))
            except BlockingIOError:
                log.warning("worker bus: %s is not reading; it keeps its entries until they expire", peer.name)
            except (ConnectionRefusedError, FileNotFoundError):
                peer.unlink(missing_ok=True)  # a worker that is gone
            except OSError as exc:
                log.warning("worker bus: cannot reach %s: %s", peer.name, exc)

    def _readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            try:
                message = loads(data)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            invalidation = Invalidation.from_json(message.get("invalidation"))
            reason = message.get("reason")
            if invalidation is not None and reason in ("purge", "notification", "stream_lost"):
                self._on_invalidation(invalidation, reason)
