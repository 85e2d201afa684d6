"""Writing answers to callers that read slowly, or not at all.

Three bounds, so that such a caller pins little memory and holds back no one:

* a write deadline that is about progress: a caller whose connection accepts no bytes for
  ``listener.write_timeout_s`` is dropped (its connection aborted, and what was queued for it
  freed), however long a caller that keeps reading takes;
* bounded chunks (:data:`CHUNK_BYTES`), each handed to the transport only once it has taken the
  previous one (its drain), so that a connection holds at most about one chunk beyond the
  transport's high-water mark. asyncio's selector transport copies what it cannot send at once
  into a buffer of its own, so a large answer written in one go would be copied whole, per
  caller; the chunks are views of the stored bytes, shared by every connection sending them;
* :class:`QueueBudget`: the chunks handed to all connections and not yet taken by them, at most
  ``listener.max_queued_bytes`` together. A writer that cannot get room waits, within its
  deadline; meanwhile the connection holding room that has taken nothing for the longest, and
  for at least :data:`STALLED_S`, is dropped to make room: under that bound, callers that stop
  reading give way to callers that read, rather than holding them back.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, Protocol

from aiohttp import web
from multidict import CIMultiDict

__all__ = ["CHUNK_BYTES", "CallerGone", "CallerWriter", "Piece", "PiecesResponse", "QueueBudget"]

#: A piece of an answer: ready bytes, or a view of stored ones.
Piece = bytes | bytearray | memoryview

#: The most bytes handed to a caller's transport at once (a view of the stored answer).
CHUNK_BYTES: Final = 64 * 1024
#: How often, as a fraction of the write deadline (or of :data:`STALLED_S`, if shorter), a blocked
#: write checks the caller's progress.
_CHECKS_PER_DEADLINE: Final = 4
#: A connection holding room in a full :class:`QueueBudget` that has taken no bytes for this long
#: is dropped for a writer waiting for room, in seconds.
STALLED_S: Final = 1.0


class Written(Protocol):
    """Told when the transport has every byte of an answer (``written = True``)."""

    written: bool


class CallerGone(ConnectionResetError):
    """The caller went away, or was dropped for taking no bytes for ``write_timeout_s``
    (``reason``: ``write_timeout``, ``queue_full``, or ``None`` when it went away itself)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class Hold:
    """Room one writer holds in a :class:`QueueBudget`: ``progress`` is when its connection last
    took bytes (loop time, seconds), ``drop()`` drops that connection."""

    __slots__ = ("drop", "progress")

    def __init__(self, progress: float, drop: Callable[[], None]) -> None:
        self.progress = progress
        self.drop = drop


class QueueBudget:
    """Bytes queued for callers and not yet taken by them, across every connection of this
    process: at most ``limit`` (bytes). Waiters are served in their order of arrival; while one
    waits, the holder (:class:`Hold`) that has taken no bytes for the longest, and for at least
    :data:`STALLED_S`, is dropped to make room."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queued = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.holds: set[Hold] = set()

    async def acquire(self, size: int) -> None:
        """Take ``size`` bytes of room (at most ``limit``), waiting until there is some.
        Unbounded in time: the caller bounds it."""
        size = min(size, self.limit)
        if not self._waiters and self.queued + size <= self.limit:
            self.queued += size
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        try:
            while not waiter.done():
                self._drop_stalled(loop.time())
                # asyncio.wait: a check that times out leaves the wait itself in place.
                await asyncio.wait((waiter,), timeout=STALLED_S / 4)
            waiter.result()
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(size)  # granted just as it was given up
            else:
                if entry in self._waiters:  # else _wake took it off, cancelled, granting nothing
                    self._waiters.remove(entry)
                self._wake()  # a smaller waiter behind it may fit now
            raise

    def release(self, size: int) -> None:
        """Give back ``size`` bytes taken with :meth:`acquire` (the same ``size``)."""
        self.queued -= min(size, self.limit)
        self._wake()

    def _drop_stalled(self, now: float) -> None:
        """Drop the holder that took no bytes for the longest, if for :data:`STALLED_S` at least
        (its room comes back when its writer sees the connection gone)."""
        stalled = [h for h in self.holds if now - h.progress >= STALLED_S]
        if stalled:
            hold = min(stalled, key=lambda h: h.progress)
            self.holds.discard(hold)
            hold.drop()

    def _wake(self) -> None:
        while self._waiters and self.queued + self._waiters[0][0] <= self.limit:
            size, waiter = self._waiters.popleft()
            if not waiter.done():
                self.queued += size
                waiter.set_result(None)


class PiecesResponse(web.StreamResponse):
    """An answer of known length made of ``pieces`` (bytes or views of stored bytes), written
    by :meth:`CallerWriter.send` in chunks rather than joined; what aiohttp would send for
    ``web.Response(body=b"".join(pieces), status=..., headers=...)``."""

    #: Set once :meth:`CallerWriter.send` writes the pieces (else :meth:`write_eof` does).
    pieces_written = False

    def __init__(self, pieces: Iterable[Piece], *, status: int = 200, headers: CIMultiDict[str]) -> None:
        super().__init__(status=status, headers=headers)
        self.pieces = tuple(pieces)
        self.content_length = sum(len(p) for p in self.pieces)

    async def write_eof(self, data: bytes = b"") -> None:
        if not self.pieces_written and self.prepared:
            # Not sent by CallerWriter.send (a path that should have): sent now, without its bounds.
            self.pieces_written = True
            for piece in self.pieces:
                await self.write(piece)
        await super().write_eof(data)


class CallerWriter:
    """Writes to callers under the write deadline (``timeout_s``, seconds of no progress) and
    the process's ``budget``; ``dropped(reason)`` counts each caller dropped (``write_timeout``,
    ``queue_full``)."""

    def __init__(self, timeout_s: float, budget: QueueBudget, dropped: Callable[[str], None] | None = None) -> None:
        self.timeout_s = timeout_s
        self.budget = budget
        self.dropped = dropped

    async def send(
        self, request: web.BaseRequest, response: web.StreamResponse, *, written: Written | None = None
    ) -> web.StreamResponse:
        """Write ``response`` whole (a :class:`PiecesResponse`, or a ``web.Response`` of ready
        bytes, which is sent as one of pieces) and return the response aiohttp is to finish.
        ``written.written`` is set once the transport has every byte of it (before the last drain).

        Raises:
            CallerGone: the caller went away, or was dropped (see the class).
        """
        if not isinstance(response, PiecesResponse):
            assert isinstance(response, web.Response)
            body = response.body
            assert isinstance(body, bytes | bytearray)
            headers = CIMultiDict(response.headers)
            headers.popall("Content-Length", None)
            response = PiecesResponse((body,), status=response.status, headers=headers)
        try:
            await response.prepare(request)
        except ConnectionError as exc:
            raise CallerGone(str(exc)) from None
        response.pieces_written = True
        *pieces, last = response.pieces or (b"",)
        for piece in pieces:
            await self.write(request, response, piece)
        await self.write(request, response, last, written=written)
        try:
            await response.write_eof()  # a length-delimited answer: nothing is left to send
        except ConnectionError:
            pass  # the caller hung up once the transport had taken the whole answer: answered
        return response

    async def write(
        self, request: web.BaseRequest, out: web.StreamResponse, data: Piece, *, written: Written | None = None
    ) -> None:
        """Write ``data`` to the prepared ``out`` in chunks of at most :data:`CHUNK_BYTES`, each
        within the budget and the write deadline; ``written.written`` is set once the transport
        has the last chunk (before its drain).

        Raises:
            CallerGone: the caller went away, or was dropped (its connection is then aborted).
        """
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            chunk = view[start : start + CHUNK_BYTES]
            size = len(chunk)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.budget.acquire(size)
            except TimeoutError:
                self._drop(request, "queue_full")
                raise CallerGone(f"no room to queue an answer for {self.timeout_s:g} s", "queue_full") from None
            hold = Hold(asyncio.get_running_loop().time(), lambda: self._drop(request, "queue_full"))
            self.budget.holds.add(hold)
            try:
                await self._progressing(request, out.write(chunk), hold)
                if written is not None and start + CHUNK_BYTES >= len(view):
                    written.written = True
                await self._progressing(request, _drain(request), hold)
            finally:
                self.budget.holds.discard(hold)
                self.budget.release(size)

    async def _progressing(self, request: web.BaseRequest, step: Awaitable[None], hold: Hold) -> None:
        """Await ``step`` (a write or a drain) for as long as the caller's transport keeps
        taking bytes (noted in ``hold``); drop the caller once it has taken none for ``timeout_s``."""
        transport = request.transport
        if transport is None or transport.is_closing():
            _close(step)
            raise CallerGone("the caller went away")
        # Run apart, so that a check does not cancel it: a cancelled drain leaves aiohttp's
        # protocol a cancelled waiter, which every later drain would raise.
        task = asyncio.ensure_future(step)
        loop = asyncio.get_running_loop()
        last_size = transport.get_write_buffer_size()
        last_progress = loop.time()
        # Often enough to tell a stalled holder (STALLED_S) from one that reads.
        every_s = min(self.timeout_s, STALLED_S) / _CHECKS_PER_DEADLINE
        try:
            while True:
                done, _ = await asyncio.wait((task,), timeout=every_s)
                if done:
                    break
                size = transport.get_write_buffer_size()
                now = loop.time()
                if size < last_size:
                    last_progress = hold.progress = now
                last_size = size
                if now - last_progress >= self.timeout_s:
                    self._drop(request, "write_timeout")
                    # Not awaited: the caller's handler learns of the drop before aiohttp
                    # cancels it for the lost connection.
                    task.cancel()
                    raise CallerGone(f"the caller took no bytes for {self.timeout_s:g} s", "write_timeout")
        except asyncio.CancelledError:
            task.cancel()
            raise
        try:
            task.result()
        except ConnectionError as exc:  # aiohttp's ClientConnectionResetError and "Connection lost"
            raise CallerGone(str(exc)) from None

    def _drop(self, request: web.BaseRequest, reason: str) -> None:
        transport = request.transport
        if transport is not None:
            transport.abort()
        if self.dropped is not None:
            self.dropped(reason)


async def _drain(request: web.BaseRequest) -> None:
    """Until the transport wants more (below its low-water mark again), or the connection is
    closed cleanly: the next write then finds the caller gone, and after the last one the answer
    is out (a caller that hangs up as soon as it has read the answer closes in the same turn as
    the transport takes the last bytes, and event loops differ in which they report first).

    Raises:
        ConnectionError: the connection was lost with an error (a reset: what was queued for it
            did not get out).
    """
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the caller went away")
    await request.writer.drain()


def _close(step: Awaitable[None]) -> None:
    close = getattr(step, "close", None)
    if close is not None:
        close()  # a coroutine never awaited: said so, rather than warned about
