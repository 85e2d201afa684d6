"""The shared index of cached resource URIs: what the listen stream of an upstream subscribes to
(``resourceSubscriptions``), whichever process holds it, learnt from every process's reads.

``<key_prefix>:uris:<upstream>:<identity>`` is a sorted set: each URI of a shared
``resources/read`` entry, scored by when that entry leaves Redis (wall-clock milliseconds since
the epoch, its stale window included). One script (:data:`_NOTE_URI`, atomic) adds a URI (its
score only ever raised), drops the members whose entries are gone, keeps the
:data:`MAX_INDEXED_URIS` that stay longest, and sets the key to expire with its longest-lived
member. So the index holds at most :data:`MAX_INDEXED_URIS` URIs of at most
:data:`MAX_URI_CHARS` characters (about 2 MiB at worst, some 100 KiB for URIs of 60 characters),
and is gone when the last of its entries is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .link import RedisLink

__all__ = ["MAX_INDEXED_URIS", "MAX_URI_CHARS", "UriIndex"]

#: Longest resource URI indexed, or taken from the index.
MAX_URI_CHARS: Final = 2048
#: Most URIs the index of one upstream holds (a listen stream subscribes to fewer).
MAX_INDEXED_URIS: Final = 1024

#: KEYS[1]: the index; ARGV: uri, when its entry leaves Redis (ms), now (ms), the cap. A key of
#: another type is removed first; members gone from Redis are dropped, then all but the cap's
#: longest-lived; the key expires with its longest-lived member.
_NOTE_URI: Final = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then redis.call('DEL', KEYS[1]) end
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', KEYS[1], math.max(1, tonumber(last[2]) - tonumber(ARGV[3])))
end
return redis.call('ZCARD', KEYS[1])
"""


class UriIndex:
    """The URI indexes of the upstreams of ``identities`` (name → identity)."""

    def __init__(self, link: RedisLink, identities: Mapping[str, str]) -> None:
        self.link = link
        self.identities = identities
        self._note = link.client.register_script(_NOTE_URI)

    def name(self, upstream: str) -> str:
        """The Redis key of ``upstream``'s index."""
        return self.link.key("uris", upstream, self.identities[upstream])

    async def note(self, upstream: str, uri: str, gone_at_ms: int, *, now_ms: int) -> int:
        """Index ``uri`` until ``gone_at_ms`` (wall-clock ms, when its entry leaves Redis); returns
        how many URIs the index holds now.

        Raises:
            redis.exceptions.RedisError, OSError: Redis failed (callers run this through
                :meth:`RedisLink.run <gateway.cluster.link.RedisLink.run>`).
        """
        held: Any = await self._note(keys=[self.name(upstream)], args=[uri, gone_at_ms, now_ms, MAX_INDEXED_URIS])
        return int(held)

    async def read(self, upstream: str, limit: int, *, now_ms: int) -> list[str]:
        """Up to ``limit`` URIs of ``upstream`` whose entries are still in Redis at ``now_ms``
        (those that stay longest), sorted; members that no stored key could have held (written by
        someone else) are left out.

        Raises:
            Unavailable: Redis is down or failed.
        """
        if upstream not in self.identities:
            return []
        name = self.name(upstream)
        raw: Any = await self.link.run(
            "uris", lambda: self.link.client.zrevrangebyscore(name, "+inf", now_ms, start=0, num=limit)
        )
        uris = []
        for member in raw or ():
            try:
                uri = member.decode("utf-8") if isinstance(member, bytes) else None
            except UnicodeDecodeError:
                continue
            if uri is not None and len(uri) <= MAX_URI_CHARS and uri.isprintable() and ":" in uri:
                uris.append(uri)
        return sorted(uris)
