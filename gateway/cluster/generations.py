"""Generations: the number in the name of every shared entry, raised by invalidation.

``<key_prefix>:generations:<upstream>:<identity>`` is a hash ``<method>`` → generation, for one
upstream as one configuration reaches it (``identity``: :meth:`~gateway.cluster.mac.Keys.identity`),
so that processes configured differently for an upstream never share a number. An invalidation
raises the generations it touches, so that every shared entry stored before it is out of reach
at once (it then expires by itself), and an answer fetched before it, stored under the old
number, is out of reach too. Each process keeps a copy (:attr:`Generations.values`, by field
``"<upstream>:<identity> <method>"``, the names events carry): loaded on (re)connecting, raised
by the events that carry new numbers.

The scripts below run in Redis, atomically, and number from Redis's own clock: a raised
generation is ``max(old + 1, now in ms)``, and a missing or unreadable one becomes ``now``. So a
generation never repeats one used before, even after Redis restarted empty or was flushed (a
process that still holds the old numbers would otherwise share names with entries from before
an invalidation), and a value written over by something else heals itself.

Bound: each hash holds at most the six cacheable methods and expires :data:`GENERATIONS_TTL_S`
after it was last used (each sync and bump, and :meth:`Generations.touch`, which every process
runs every :data:`TOUCH_S`): the hashes of a configuration no process uses any more go away.
One that comes back is numbered from ``now`` again, which names no entry stored before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from .link import RedisLink, Unavailable

__all__ = ["GENERATIONS_TTL_S", "TOUCH_S", "Generations"]

log = logging.getLogger("mcp_gateway.cluster")

#: A generations hash no process touched for this long expires, in seconds.
GENERATIONS_TTL_S: Final = 86_400
#: How often each process pushes the expiry of its hashes out, in seconds.
TOUCH_S: Final = 3_600

#: Shared by the scripts: ``now`` (ms, Redis's clock), ``plausible(v)``: ``v`` as an integer
#: generation, or nil when it is absent, not a whole number, negative or more than a year ahead
#: (written by something other than this gateway), and ``each(k)``: a key of another type
#: than a hash is removed first. KEYS: the hashes; ARGV[1]: their expiry (ms); ARGV[2..]: methods.
_PRELUDE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function plausible(v)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or n < 0 or n > now + 31536000000 then return nil end
  return n
end
local function each(k)
  local kind = redis.call('TYPE', k)['ok']
  if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', k) end
end
"""

#: Returns ``[missing, unreadable, value...]``: each (key, method)'s generation in order, missing
#: or unreadable ones set to ``now`` first.
_SYNC: Final = (
    _PRELUDE
    + """
local out = {0, 0}
for _, k in ipairs(KEYS) do
  each(k)
  for i = 2, #ARGV do
    local raw = redis.call('HGET', k, ARGV[i])
    local n = plausible(raw)
    if n == nil then
      if raw then out[2] = out[2] + 1 else out[1] = out[1] + 1 end
      n = now
      redis.call('HSET', k, ARGV[i], string.format('%d', n))
    end
    out[#out + 1] = n
  end
  redis.call('PEXPIRE', k, ARGV[1])
end
return out
"""
)

#: Returns each (key, method)'s raised generation in order, ``max(old + 1, now)``.
_BUMP: Final = (
    _PRELUDE
    + """
local out = {}
for _, k in ipairs(KEYS) do
  each(k)
  for i = 2, #ARGV do
    local n = math.max((plausible(redis.call('HGET', k, ARGV[i])) or 0) + 1, now)
    redis.call('HSET', k, ARGV[i], string.format('%d', n))
    out[#out + 1] = n
  end
  redis.call('PEXPIRE', k, ARGV[1])
end
return out
"""
)


class Generations:
    """This process's copy of the generations of ``identities`` (upstream name → identity) for
    ``methods``, and the ways to change them in Redis."""

    def __init__(self, link: RedisLink, identities: Mapping[str, str], methods: Sequence[str]) -> None:
        self.link = link
        self.identities = dict(identities)
        self.methods = list(methods)
        self.fields = frozenset(self.field(u, m) for u in self.identities for m in self.methods)
        self.values: dict[str, int] = {}
        #: Upstreams whose generations a reload gave a new identity and Redis has not given yet:
        #: their entries are not shared until it has (:meth:`sync`).
        self.unsynced: set[str] = set()
        self._synced = asyncio.Event()
        self._synced.set()
        self._sync = link.client.register_script(_SYNC)
        self._bump = link.client.register_script(_BUMP)
        self._ttl_ms = str(GENERATIONS_TTL_S * 1000)

    def field(self, upstream: str, method: str) -> str:
        """The name of ``upstream``'s ``method`` generation, in the copy and in events."""
        return f"{upstream}:{self.identities[upstream]} {method}"

    def name(self, upstream: str) -> str:
        """The Redis key of ``upstream``'s hash."""
        return self.link.key("generations", upstream, self.identities[upstream])

    def of(self, field: str) -> int:
        return self.values.get(field, 0)

    def reidentify(self, identities: Mapping[str, str]) -> list[str]:
        """Follow a reloaded config (``identities``: upstream name → identity): returns the
        upstreams whose identity is new, :attr:`unsynced` until :meth:`sync` reads theirs."""
        fresh = [name for name, identity in identities.items() if self.identities.get(name) != identity]
        self.identities = dict(identities)
        self.fields = frozenset(self.field(u, m) for u in self.identities for m in self.methods)
        self.values = {f: v for f, v in self.values.items() if f in self.fields}
        self.unsynced = (self.unsynced & set(identities)) | set(fresh)
        if self.unsynced:
            self._synced.clear()
        return fresh

    async def settled(self, timeout_s: float) -> bool:
        """Wait until no upstream is :attr:`unsynced`, at most ``timeout_s`` seconds; whether none is."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._synced.wait()
        return not self.unsynced

    async def sync(self, only: Iterable[str] | None = None) -> None:
        """Take Redis's generations into the copy (run while reconnecting, under the feed's own
        bound; ``only``: of these upstreams, else of all); never lowers one (an event read
        meanwhile may have raised it).

        Raises:
            redis.exceptions.RedisError, OSError: Redis failed.
        """
        upstreams = list(self.identities) if only is None else [u for u in only if u in self.identities]
        if not upstreams:
            return
        raw: Any = await self._sync(keys=[self.name(u) for u in upstreams], args=[self._ttl_ms, *self.methods])
        missing, unreadable, *values = (int(v) for v in raw)
        if unreadable:
            log.warning("shared tier: %d generations in Redis were not numbers; renumbered", unreadable)
            self.link.metrics.cluster_errors.labels("corrupt_generations").inc()
        elif missing and self.values and not self.unsynced.issuperset(upstreams):
            # (A reload's new identities have no hash yet: that is no loss.)
            log.info("shared tier: generations were gone (Redis restarted empty, flushed, or expired); renumbered")
        fields = [self.field(u, m) for u in upstreams for m in self.methods]
        self.adopt(dict(zip(fields, values, strict=True)))
        self.unsynced.difference_update(upstreams)
        if not self.unsynced:
            self._synced.set()

    async def sync_soon(self, upstreams: list[str], *, retry_s: float = 1.0) -> None:
        """:meth:`sync` of ``upstreams`` (a reload's new identities), tried every ``retry_s``
        seconds while Redis does not take it, until they are synced (here or on reconnecting) or gone."""
        while self.unsynced.intersection(upstreams):
            try:
                await self.link.run("generations", lambda: self.sync(self.unsynced.intersection(upstreams)))
                return
            except Unavailable:
                await asyncio.sleep(retry_s)

    async def bump(self, upstreams: Iterable[str], methods: Sequence[str], *, force: bool = False) -> dict[str, int]:
        """Raise ``methods`` of ``upstreams`` in Redis and in the copy; returns their new values
        by field (``force``: tried even while the shared tier is not up, :meth:`RedisLink.run`).

        Raises:
            Unavailable: Redis is down or failed.
        """
        names = [u for u in upstreams if u in self.identities]
        if not names or not methods:
            return {}
        keys = [self.name(u) for u in names]
        raw: Any = await self.link.run(
            "invalidate", lambda: self._bump(keys=keys, args=[self._ttl_ms, *methods]), force=force
        )
        fields = [self.field(u, m) for u in names for m in methods]
        raised = dict(zip(fields, (int(v) for v in raw), strict=True))
        self.adopt(raised)
        return raised

    async def touch(self) -> None:
        """Push the expiry of this process's hashes out to :data:`GENERATIONS_TTL_S` from now.

        Raises:
            Unavailable: Redis is down or failed.
        """

        async def expire() -> None:
            async with self.link.client.pipeline(transaction=False) as pipe:
                for upstream in self.identities:
                    pipe.pexpire(self.name(upstream), GENERATIONS_TTL_S * 1000)
                await pipe.execute()

        await self.link.run("generations", expire)

    def adopt(self, generations: object) -> None:
        """Take the newer of each generation in ``generations`` (an event's) and the copy's;
        fields of other configurations are not this process's business."""
        if not isinstance(generations, dict):
            return
        for f, value in generations.items():
            if f in self.fields and type(value) is int and value > self.values.get(f, 0):
                self.values[f] = value
