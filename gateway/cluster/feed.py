"""The cluster's event feed: one Redis stream every process reads, in order, without gaps.

Two kinds of event travel on ``<key_prefix>:events`` (a Redis stream, trimmed to about
:data:`STREAM_MAXLEN` events), each one JSON object in the field ``e`` and its HMAC-SHA256 in
the field ``m`` (:mod:`gateway.cluster.mac`; an event without the right one is ignored and
counted under ``mcp_gateway_cluster_errors_total{operation="forged_event"}``):

* ``{"type": "invalidate", "invalidation": {...}, "reason": str, "generations": {field: n}, "origin": id,
  "echo": bool}``:
  entries went stale (a purge, a listen-stream notification, a lost listen stream); every process
  drops the matching entries from its local tier and adopts the new generations (see
  :mod:`gateway.cluster.node`).
* ``{"type": "done", "id": str, "stored": bool}``: the leader of a cold key finished; followers
  in every process stop waiting.

A stream rather than pub/sub: a reader that lost its connection resumes after the last event it
read and misses nothing. The reader also decides whether Redis is *down*
(:mod:`gateway.cluster.link` keeps the state: whether writes go through is the heartbeat's
verdict): a read that fails twice in a row, or the stream gone further than the reader had got
(trimmed while it was away or behind), empties the local tier and reloads the generations, so
no process answers from an entry another one invalidated for longer than about :data:`BLOCK_S`
+ two call bounds (under 1 s with the default ``timeout_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from redis.exceptions import RedisError, ResponseError

from ..codec import dumps, loads
from ..config import ClusterConfig
from ..tasks import cancel_requested
from .link import RedisLink, make_client
from .mac import Keys

__all__ = ["BLOCK_S", "STREAM_MAXLEN", "Feed"]

log = logging.getLogger("mcp_gateway.cluster")

#: How long one read of the stream waits for an event, in seconds.
BLOCK_S: Final = 0.3
#: Events kept in the stream (approximately): far more than a reader falls behind by.
STREAM_MAXLEN: Final = 100_000
#: How often a reader that keeps up checks that it has not been left behind by trimming, in s.
GAP_CHECK_S: Final = 5.0
#: Pauses between attempts to reach Redis while it is down, in seconds (first, then at most).
RETRY_MIN_S: Final = 0.1
RETRY_MAX_S: Final = 1.0

#: ``on_event(event)``: a decoded event object (a dict) from the stream.
EventHandler = Callable[[dict[str, Any]], None]


class Feed:
    """Reads ``<key_prefix>:events`` for this process and publishes to it.

    ``on_event`` receives every event (this process's own included); ``on_up()`` runs when
    Redis answers again (before the link is marked reading: a chance to reload shared state),
    and ``on_lost(reason)`` when events were missed. The feed's verdict, whether it reads,
    goes to :meth:`RedisLink.mark` (the link's state machine takes it from there).
    """

    def __init__(
        self,
        config: ClusterConfig,
        link: RedisLink,
        *,
        keys: Keys,
        on_event: EventHandler,
        on_up: Callable[[], Any],
        on_lost: Callable[[str], None],
    ) -> None:
        self.link = link
        self.keys = keys
        self.stream = link.key("events")
        # Its own connection: a blocking read must not hold one of the command pool's.
        self._reader = make_client(config, BLOCK_S + config.timeout_s, 2)
        self._on_event = on_event
        self._on_up = on_up
        self._on_lost = on_lost
        self._last_id: bytes | None = None
        self._gap_checked = 0.0

    async def publish(self, event: dict[str, Any], *, force: bool = False) -> None:
        """Append ``event`` to the stream (``force``: tried even while the shared tier is not
        up, :meth:`RedisLink.run`).

        Raises:
            Unavailable: Redis is down or the call failed.
        """
        data = dumps(event)
        fields: dict[Any, Any] = {"e": data, "m": self.keys.mac(data, "event")}
        await self.link.run(
            "publish",
            lambda: self.link.client.xadd(self.stream, fields, maxlen=STREAM_MAXLEN, approximate=True),
            force=force,
        )

    async def run(self) -> None:
        """Read events until cancelled; reconnect whenever Redis fails, with a growing pause."""
        pause = RETRY_MIN_S
        failures = 0
        while True:
            try:
                if not self.link.reading:
                    await self._connect()
                    pause = RETRY_MIN_S
                await self._read()
                failures = 0
            except (RedisError, OSError, TimeoutError) as exc:
                if cancel_requested():  # the client turned our cancellation into an error: end as asked
                    raise asyncio.CancelledError from exc
                if isinstance(exc, ResponseError) and "WRONGTYPE" in str(exc):
                    await self._replace_stream()
                    continue
                failures += 1
                if failures == 1 and self.link.reading:
                    continue  # one dropped connection: read again at once, from the same event
                self.link.metrics.cluster_errors.labels("feed").inc()
                self.link.mark(False, _describe(exc))  # leaving "up" empties the local tier (the link's on_change)
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)

    async def _connect(self) -> None:
        """Find where to read from (after the last event read, or the stream's end), reload
        shared state, then mark Redis up."""
        async with asyncio.timeout(self.link.timeout_s * 4):
            if self._last_id is None:
                newest: Any = await self._reader.xrevrange(self.stream, count=1)
                self._last_id = newest[0][0] if newest else b"0-0"
            else:
                oldest: Any = await self._reader.xrange(self.stream, count=1)
                if not oldest and self._last_id != b"0-0":
                    # Emptied while this process was away (deleted, flushed): it cannot know what it missed.
                    self._last_id = b"0-0"
                    self._on_lost("events missed")
                elif oldest and _stream_id(oldest[0][0]) > _stream_id(self._last_id):
                    # Trimmed past where this process stopped: some events are lost to it.
                    self._on_lost("events missed")
            result = self._on_up()
            if asyncio.iscoroutine(result):
                await result
        self.link.mark(True)

    async def _read(self) -> None:
        assert self._last_id is not None
        batches: Any = await self._reader.xread({self.stream: self._last_id}, count=_BATCH, block=int(BLOCK_S * 1000))
        read = 0
        for _stream, events in batches or ():
            for event_id, fields in events:
                self._last_id = event_id
                self._dispatch(fields)
            read += len(events)
        now = asyncio.get_running_loop().time()
        if read == _BATCH or now - self._gap_checked >= GAP_CHECK_S:
            # Behind, or a while since the last look: has the stream been trimmed past us?
            self._gap_checked = now
            oldest: Any = await self._reader.xrange(self.stream, count=1)
            if oldest and self._behind(oldest[0][0]):
                self._last_id = _previous(oldest[0][0])
                await self._resync("events missed (trimmed while this process was behind)")

    def _behind(self, oldest_id: bytes) -> bool:
        """Whether the stream's oldest event is newer than the last one read: that one was
        trimmed, which happens only behind :data:`STREAM_MAXLEN` newer events, so some of those
        were never read (or the stream was deleted and started again)."""
        assert self._last_id is not None
        return self._last_id != b"0-0" and _stream_id(oldest_id) > _stream_id(self._last_id)

    async def _resync(self, reason: str) -> None:
        """Events were missed: the local tier is emptied and the shared state reloaded."""
        self._on_lost(reason)
        result = self._on_up()
        if asyncio.iscoroutine(result):
            await result

    def _dispatch(self, fields: object) -> None:
        data = fields.get(b"e") if isinstance(fields, dict) else None
        if not isinstance(data, bytes) or not isinstance(fields, dict):
            self.link.metrics.cluster_errors.labels("corrupt_event").inc()
            return
        if not self.keys.verify(data, fields.get(b"m"), "event"):
            self.link.metrics.cluster_errors.labels("forged_event").inc()
            return
        try:
            event = loads(data)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            self.link.metrics.cluster_errors.labels("corrupt_event").inc()
            return
        self._on_event(event)

    async def _replace_stream(self) -> None:
        """The stream's key holds something else (written over): remove it and start afresh."""
        log.warning("shared tier: %s is not a stream; replacing it", self.stream)
        self.link.metrics.cluster_errors.labels("corrupt_event").inc()
        try:
            async with asyncio.timeout(self.link.timeout_s):
                await self._reader.delete(self.stream)
        except (RedisError, OSError, TimeoutError):
            pass
        self._last_id = b"0-0"
        await self._resync("events missed (the stream was written over)")

    async def close(self) -> None:
        await self._reader.aclose()


def _stream_id(value: bytes) -> tuple[int, int]:
    ms, _, seq = value.partition(b"-")
    return int(ms), int(seq or 0)


def _previous(value: bytes) -> bytes:
    """An id just before ``value`` (so that reading after it starts at ``value``)."""
    ms, seq = _stream_id(value)
    return f"{ms}-{seq - 1}".encode() if seq else f"{ms - 1}-{2**64 - 1}".encode()


_BATCH: Final = 256


def _describe(exc: BaseException) -> str:
    return "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"[:200]
