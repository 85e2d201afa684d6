"""The link to Redis: one client, a bound on every call, and whether Redis answers.

Every call goes through :meth:`RedisLink.run`, which bounds it by ``[cluster].timeout_s`` and
turns any Redis failure (refused, reset, timed out, an error reply) into :class:`Unavailable`:
the caller then serves without Redis. Whether Redis is *up* is decided by the invalidation feed
(:mod:`gateway.cluster.feed`), which talks to it all the time; while it is down, :meth:`run`
fails at once instead of waiting out a bound on every request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import LockError, RedisError

from ..config import ClusterConfig
from ..telemetry import GatewayMetrics

__all__ = ["MAX_CONNECTIONS", "RedisLink", "Unavailable"]

log = logging.getLogger("mcp_gateway.cluster")

T = TypeVar("T")

#: Connections one process opens to Redis at most (a call past it fails, and is served without).
MAX_CONNECTIONS: Final = 64


class Unavailable(Exception):
    """A Redis call failed, timed out or was not tried because Redis is down."""


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
    shared tier's state (``mcp_gateway_cluster_up``, one log line per change)."""

    def __init__(self, config: ClusterConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.timeout_s = config.timeout_s
        self.client = make_client(config, config.timeout_s, MAX_CONNECTIONS)
        self._prefix = config.key_prefix + ":"
        #: Unknown (down) until the feed has read from Redis once.
        self.up = False
        #: Set while ``up``: lets a task wait for Redis instead of polling.
        self.answering = asyncio.Event()
        metrics.cluster_up.set(0)
        self._down_reason: str | None = "not connected yet"
        self._known = False

    def key(self, *parts: str) -> str:
        """The Redis key (or channel) ``<key_prefix>:<part>:<part>...``."""
        return self._prefix + ":".join(parts)

    async def run(self, operation: str, command: Callable[[], Awaitable[T]]) -> T:
        """``await command()`` within ``timeout_s``; ``operation`` names it in
        ``mcp_gateway_cluster_errors_total``.

        Raises:
            Unavailable: Redis is down, or the call failed or took too long.
            redis.exceptions.LockError: a lock call found the lock not (or no longer) this one's.
        """
        if not self.up:
            raise Unavailable(self._down_reason or "down")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await command()
        except LockError:
            raise  # an answer about a lock (not ours any more), not a failure of Redis
        except (RedisError, OSError, TimeoutError) as exc:
            self.metrics.cluster_errors.labels(operation).inc()
            raise Unavailable(f"{operation}: {_describe(exc)}") from exc

    def mark(self, up: bool, reason: str | None = None) -> None:
        """Record that Redis answers (``up``) or not (``reason`` says why); logs each change once,
        and the first verdict (a process that never reaches Redis says why)."""
        if up == self.up and self._known:
            return
        self._known = True
        self.up = up
        if up:
            self.answering.set()
        else:
            self.answering.clear()
        self.metrics.cluster_up.set(1 if up else 0)
        if up:
            log.info("shared tier up: sharing the cache, single flight and invalidation through Redis")
            self._down_reason = None
        else:
            self._down_reason = reason
            log.warning("shared tier down (%s): serving from the local cache and the upstreams", reason)

    async def close(self) -> None:
        await self.client.aclose()


def _describe(exc: BaseException) -> str:
    """A short reason for a failed call (never the URL: it may hold a password)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"[:200]
