"""Generations: the number in the name of every shared entry, raised by invalidation.

``<key_prefix>:generations`` is a hash ``"<upstream> <method>"`` → generation. An invalidation
raises the generations it touches, so that every shared entry stored before it is out of reach
at once (it then expires by itself), and an answer fetched before it, stored under the old
number, is out of reach too. Each process keeps a copy (:attr:`Generations.values`): loaded on
(re)connecting, raised by the events that carry new numbers.

Both scripts below run in Redis, atomically, and number from Redis's own clock: a raised
generation is ``max(old + 1, now in ms)``, and a missing or unreadable one becomes ``now``. So a
generation never repeats one used before, even after Redis restarted empty or was flushed (a
process that still holds the old numbers would otherwise share names with entries from before
an invalidation), and a value written over by something else heals itself.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from .link import RedisLink

__all__ = ["Generations"]

log = logging.getLogger("mcp_gateway.cluster")

#: Shared by both scripts: ``now`` (ms, Redis's clock), and ``plausible(v)``: ``v`` as an integer
#: generation, or nil when it is absent, not a whole number, negative or more than a year ahead
#: (written by something other than this gateway). A key of another type is removed first.
_PRELUDE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function plausible(v)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or n < 0 or n > now + 31536000000 then return nil end
  return n
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', KEYS[1]) end
"""

#: ARGV: fields. Returns ``[missing, unreadable, value...]``: each field's generation, missing or
#: unreadable ones set to ``now`` first.
_SYNC: Final = (
    _PRELUDE
    + """
local out = {0, 0}
for i, f in ipairs(ARGV) do
  local raw = redis.call('HGET', KEYS[1], f)
  local n = plausible(raw)
  if n == nil then
    if raw then out[2] = out[2] + 1 else out[1] = out[1] + 1 end
    n = now
    redis.call('HSET', KEYS[1], f, string.format('%d', n))
  end
  out[i + 2] = n
end
return out
"""
)

#: ARGV: fields. Returns each field's raised generation, ``max(old + 1, now)``.
_BUMP: Final = (
    _PRELUDE
    + """
local out = {}
for i, f in ipairs(ARGV) do
  local n = math.max((plausible(redis.call('HGET', KEYS[1], f)) or 0) + 1, now)
  redis.call('HSET', KEYS[1], f, string.format('%d', n))
  out[i] = n
end
return out
"""
)


class Generations:
    """This process's copy of the generations, and the two ways to change them in Redis."""

    def __init__(self, link: RedisLink, fields: list[str]) -> None:
        self.link = link
        self.name = link.key("generations")
        self.fields = fields
        self.values: dict[str, int] = {}
        self._sync = link.client.register_script(_SYNC)
        self._bump = link.client.register_script(_BUMP)

    def of(self, field: str) -> int:
        return self.values.get(field, 0)

    async def sync(self) -> None:
        """Replace the copy with Redis's (run while reconnecting, under the feed's own bound).

        Raises:
            redis.exceptions.RedisError, OSError: Redis failed.
        """
        raw: Any = await self._sync(keys=[self.name], args=self.fields)
        missing, unreadable, *values = (int(v) for v in raw)
        if unreadable:
            log.warning("shared tier: %d generations in %s were not numbers; renumbered", unreadable, self.name)
            self.link.metrics.cluster_errors.labels("corrupt_generations").inc()
        elif missing and self.values:
            log.info("shared tier: %s was gone (Redis restarted empty, or flushed); renumbered", self.name)
        self.values = dict(zip(self.fields, values, strict=True))

    async def bump(self, fields: list[str], *, force: bool = False) -> dict[str, int]:
        """Raise ``fields`` in Redis and in the copy; returns their new values (``force``:
        tried even while the shared tier is not up, :meth:`RedisLink.run`).

        Raises:
            Unavailable: Redis is down or failed.
        """
        raw: Any = await self.link.run("invalidate", lambda: self._bump(keys=[self.name], args=fields), force=force)
        raised = dict(zip(fields, (int(v) for v in raw), strict=True))
        self.adopt(raised)
        return raised

    def adopt(self, generations: object) -> None:
        """Take the newer of each generation in ``generations`` (an event's) and the copy's."""
        if not isinstance(generations, dict):
            return
        for f, value in generations.items():
            if isinstance(f, str) and type(value) is int and value > self.values.get(f, 0):
                self.values[f] = value
