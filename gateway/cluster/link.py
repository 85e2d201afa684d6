"""The link to Redis: one client, a bound on every call, and what the shared tier can do now.

Every call goes through :meth:`RedisLink.run`, which bounds it by ``[cluster].timeout_s`` and
turns any Redis failure (refused, reset, timed out, an error reply) into :class:`Unavailable`:
the caller then serves without Redis.

The shared tier is in one of three states, decided here and nowhere else:

* ``up``: the feed reads (:mod:`gateway.cluster.feed`) and writes go through. Shared entries,
  single flight and invalidation work through Redis (``mcp_gateway_cluster_up`` 1).
* ``down``: the feed cannot read (Redis stopped, unreachable, paused; the feed decides, as it
  talks to Redis all the time). Nothing is shared; every process serves from its local tier and
  the upstreams, as a gateway without ``[cluster]`` does. Entering it from ``up`` empties the
  local tier (what was invalidated meanwhile cannot be heard).
* ``read_only``: the feed reads, but a write was refused (an error reply: ``maxmemory`` reached
  with ``noeviction``, a read-only replica) or timed out twice in a row. Invalidations cannot be
  carried (no process hears this one's, nor this one of theirs), so this process fails closed on
  staleness and open on availability: entering it empties the local tier (its entries can no
  longer be vouched for) and holds it (:meth:`~gateway.cache.MemoryStore.hold`: nothing is
  stored), and nothing is read from or written to Redis; every cacheable request goes upstream.
  A local hit costs nothing more: the local tier is simply empty.

Whether writes go through is decided by a heartbeat (:meth:`RedisLink.heartbeat`): every
:data:`HEARTBEAT_S` while the feed reads, one ``SET <key_prefix>:heartbeat:<process id>`` with an
expiry of :data:`HEARTBEAT_TTL_MS` (one key a process, gone shortly after it stops). The first
heartbeat that goes through sends this process's pending invalidations (``before_writable``:
:mod:`gateway.cluster.outbox`); a ``read_only`` process is ``up`` again once they went through
and writes have gone through for :data:`SETTLE_S`, two heartbeats: every other live process has
sent its own pending ones by then, so none reads a shared entry they invalidate. A process that
reconnects (``down`` to ``up``) writes one heartbeat before it is ``up`` (the feed's ``on_up``
calls :meth:`RedisLink.beat` with ``settle=False``), unless it has invalidations waiting: then
it is ``read_only`` until the heartbeat sent them.

While the state is not ``up``, :meth:`run` fails at once instead of waiting out a bound on every
request; ``force=True`` tries anyway (the heartbeat and pending invalidations).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Final, Literal, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import LockError, RedisError, ResponseError

from ..config import ClusterConfig
from ..tasks import cancel_requested
from ..telemetry import GatewayMetrics

__all__ = ["HEARTBEAT_S", "MAX_CONNECTIONS", "SETTLE_S", "RedisLink", "State", "Unavailable"]

log = logging.getLogger("mcp_gateway.cluster")

T = TypeVar("T")

#: Connections one process opens to Redis at most (a call past it fails, and is served without).
MAX_CONNECTIONS: Final = 64
#: How often each process writes its heartbeat while the feed reads, in seconds.
HEARTBEAT_S: Final = 0.25
#: The heartbeat key's expiry, in milliseconds.
HEARTBEAT_TTL_MS: Final = 5_000
#: How long writes must go through before a ``read_only`` process is ``up`` again, in seconds.
SETTLE_S: Final = 0.5

State = Literal["down", "read_only", "up"]
#: ``on_change(old, new, reason)``: the state changed.
StateListener = Callable[[State, State, str], None]


class Unavailable(Exception):
    """A Redis call failed, timed out or was not tried because the shared tier is not up.
    ``refused``: Redis answered with an error (it is there, but does not take the command)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def make_client(config: ClusterConfig, read_timeout_s: float, max_connections: int) -> Redis:
    """A redis-py asyncio client for ``redis_url``: no retries (a failed call is served around,
    not repeated), connect bounded by ``timeout_s``, reads by ``read_timeout_s`` (seconds)."""
    return Redis.from_url(
        config.redis_url,
        socket_timeout=read_timeout_s,
        socket_connect_timeout=config.timeout_s,
        retry=Retry(NoBackoff(), 0),
        max_connections=max_connections,
        client_name=f"{config.key_prefix}-gateway",
    )


class RedisLink:
    """The gateway's Redis: ``client`` for commands, key names under ``key_prefix``, and the
    shared tier's state (see the module; ``mcp_gateway_cluster_up``, one log line per change).

    ``on_change`` hears every change of state; ``before_writable()`` runs before a
    ``read_only`` process is ``up`` again, and says whether it may be (its pending invalidations
    went through)."""

    def __init__(self, config: ClusterConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.timeout_s = config.timeout_s
        self.client = make_client(config, config.timeout_s, MAX_CONNECTIONS)
        self._prefix = config.key_prefix + ":"
        self._beat_key = self.key("heartbeat", secrets.token_hex(8))
        #: ``reading and writable``, what every shared operation checks; unknown (down) at first.
        self.up = False
        self.state: State = "down"
        #: The feed reads the stream.
        self.reading = False
        #: Writes go through (``None``: not tried yet).
        self.writable: bool | None = None
        #: Set while ``up``: lets a task wait for Redis instead of polling.
        self.answering = asyncio.Event()
        self.on_change: StateListener | None = None
        self.before_writable: Callable[[], Awaitable[bool]] | None = None
        metrics.cluster_up.set(0)
        self._down_reason: str = "not connected yet"
        self._known = False
        self._timeouts = 0
        self._writes_ok_since: float | None = None
        #: Why writes were last found not to go through (logged when the state it caused shows).
        self._refusal = ""

    def key(self, *parts: str) -> str:
        """The Redis key (or channel) ``<key_prefix>:<part>:<part>...``."""
        return self._prefix + ":".join(parts)

    async def run(self, operation: str, command: Callable[[], Awaitable[T]], *, force: bool = False) -> T:
        """``await command()`` within ``timeout_s``; ``operation`` names it in
        ``mcp_gateway_cluster_errors_total``. ``force``: try even when the state is not ``up``.

        Raises:
            Unavailable: the shared tier is not up, or the call failed or took too long.
            redis.exceptions.LockError: a lock call found the lock not (or no longer) this one's.
        """
        if not self.up and not force:
            raise Unavailable(self._down_reason)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await command()
        except LockError:
            raise  # an answer about a lock (not ours any more), not a failure of Redis
        except (RedisError, OSError, TimeoutError) as exc:
            if cancel_requested():  # the client turned our cancellation into an error
                raise asyncio.CancelledError from exc
            self.metrics.cluster_errors.labels(operation).inc()
            raise Unavailable(f"{operation}: {_describe(exc)}", refused=isinstance(exc, ResponseError)) from exc

    # -- the state machine --

    def mark(self, up: bool, reason: str | None = None) -> None:
        """The feed's verdict: it reads (``up``) or not (``reason`` says why). Losing the feed
        also forgets whether writes go through (a reconnecting process proves it again)."""
        self.reading = up
        if not up and self.writable:
            self.writable = None  # proven again on reconnecting; a refusal stands until it settles
        elif up and self.writable is None:
            self.writable = True  # the first verdict (or a test's link): nothing refused yet
        self._update(reason)

    def refused(self, reason: str) -> None:
        """A write this process needed was refused or timed out (an invalidation): ``read_only``
        now, without waiting for the next heartbeat."""
        self._set_writable(False, reason)

    async def beat(self, *, settle: bool = True) -> None:
        """Write the heartbeat once and take its verdict (see the module): a refused write, or
        the second timed-out one in a row, is ``read_only``; a write that goes through runs
        ``before_writable()`` (pending invalidations), and once they went through and writes
        have for :data:`SETTLE_S` (at once with ``settle=False``), ``read_only`` ends."""
        try:
            await self.run("heartbeat", lambda: self.client.set(self._beat_key, b"1", px=HEARTBEAT_TTL_MS), force=True)
        except Unavailable as exc:
            self._timeouts += 1
            if exc.refused or self._timeouts >= 2 or not self.reading:
                self._set_writable(False, str(exc))
            return
        self._timeouts = 0
        if self.writable:
            return
        now = asyncio.get_running_loop().time()
        if self._writes_ok_since is None:
            self._writes_ok_since = now
        # What this process could not send goes at its first write that goes through, before any
        # other process (settling) can be up again and read the entries it invalidates.
        if self.before_writable is not None and not await self.before_writable():
            return
        if settle and self.writable is False and now - self._writes_ok_since < SETTLE_S:
            return
        self._set_writable(True)

    async def heartbeat(self) -> None:
        """:meth:`beat` every :data:`HEARTBEAT_S` while the feed reads, until cancelled."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if self.reading:
                await self.beat()

    def _set_writable(self, writable: bool, reason: str | None = None) -> None:
        if not writable:
            self._writes_ok_since = None
            self._refusal = reason or self._refusal
        if writable == self.writable:
            return
        self.writable = writable
        self._update(reason)

    def _update(self, reason: str | None) -> None:
        old = self.state
        new: State = "down" if not self.reading else "up" if self.writable else "read_only"
        if new == old and (self._known or reason is None):
            return  # the first verdict to log is the feed's (it says why when it cannot read)
        self._known = True
        self.state = new
        self.up = new == "up"
        if self.up:
            self.answering.set()
        else:
            self.answering.clear()
        self.metrics.cluster_up.set(1 if self.up else 0)
        if new == "up":
            log.info("shared tier up: sharing the cache, single flight and invalidation through Redis")
            self._down_reason = ""
        elif new == "down":
            self._down_reason = reason or "down"
            log.warning("shared tier down (%s): serving from the local cache and the upstreams", self._down_reason)
        else:
            # A refusal found while the feed was down shows only when it reads again: its reason then.
            why = reason or self._refusal or "a write did not go through"
            self._down_reason = f"Redis refuses writes ({why})"
            log.warning(
                "shared tier read-only (a write was refused: %s): invalidations cannot travel, so nothing is "
                "cached here (every cacheable request goes upstream) until Redis takes writes again",
                why,
            )
        if self.on_change is not None and new != old:
            self.on_change(old, new, self._down_reason)

    async def close(self) -> None:
        await self.client.aclose()


def _describe(exc: BaseException) -> str:
    """A short reason for a failed call (never the URL: it may hold a password)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"[:200]
