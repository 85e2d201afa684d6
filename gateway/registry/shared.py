"""The registry across a cluster: the lease holder's view of an upstream, shared through Redis.

The process that holds an upstream's lease (:mod:`gateway.cluster.lease`) probes it and holds its
listen stream; every :data:`MIRROR_S` it writes that upstream's :class:`UpstreamState` to
``<key_prefix>:registry:<name>:<identity>`` (expiring :data:`STATE_TTL_S` after the last
write), and every other process copies it from there, so that ``/v0.1/servers``,
``/registry/versions`` and ``/readyz`` say the same on every replica configured alike for that
upstream (``identity``: :meth:`~gateway.cluster.mac.Keys.identity`; a replica configured
otherwise has its own holder and state). Versions observed in real traffic by a process that
is not the holder are posted to ``<key_prefix>:observed:<name>:<identity>`` (a set the holder
empties into its own state every :data:`MIRROR_S`; it expires :data:`STATE_TTL_S` after the
last post, and a process posts only versions it had not seen, at most
:data:`~.state.MAX_VERSIONS`). What is read
back is checked: its HMAC-SHA256 first (the state is written as the MAC, 32 bytes, then the
JSON; :mod:`gateway.cluster.mac`), then validated (pydantic, against :class:`UpstreamState`); a
value that fails either is ignored (``cluster_errors{operation="forged_registry"}`` or
``"corrupt_registry"``), and the last good copy kept.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from ..cluster import RedisLink
from ..cluster.mac import MAC_BYTES, Keys
from ..codec import dumps
from .state import MAX_VERSIONS, RegistryState, UpstreamState

__all__ = ["MIRROR_S", "RegistryMirror"]

log = logging.getLogger("mcp_gateway.registry")

#: How often the holder writes, and the others read, each upstream's state, in seconds.
MIRROR_S: Final = 1.0
#: A written state outlives its writer by this long (in seconds): the holder's successor
#: writes long before.
STATE_TTL_S: Final = 60.0

_STATE: Final = TypeAdapter(UpstreamState)


class RegistryMirror:
    """Writes and reads the shared copies of the registry's per-upstream state."""

    def __init__(self, link: RedisLink, state: RegistryState, identities: Mapping[str, str], keys: Keys) -> None:
        self.link = link
        self.state = state
        self.identities = identities
        self.keys = keys

    def _key(self, kind: str, name: str) -> str:
        return self.link.key(kind, name, self.identities[name])

    async def publish(self, name: str) -> None:
        """Write ``name``'s state (the holder), after taking in the versions others observed.

        Raises:
            Unavailable: Redis is down or failed.
        """
        state = self.state.upstreams[name]
        mailbox, key = self._key("observed", name), self._key("registry", name)

        async def take() -> list[Any]:
            async with self.link.client.pipeline(transaction=True) as pipe:
                pipe.smembers(mailbox)
                pipe.delete(mailbox)
                members, _ = await pipe.execute()
            return list(members)

        taken = await self.link.run("registry", take)
        if self.state.upstreams.get(name) is not state:
            return  # a reload started it over meanwhile: not this state's key any more
        for raw in taken:
            if isinstance(raw, bytes):
                self.state.observe(name, raw.decode("utf-8", "replace"))
        data = dumps(_STATE.dump_python(state, mode="json"))
        value = self.keys.mac(data, "state") + data
        await self.link.run("registry", lambda: self.link.client.set(key, value, px=int(STATE_TTL_S * 1000)))

    async def load(self, name: str) -> bool:
        """Copy ``name``'s shared state into this process (not the holder); whether there was a
        valid one.

        Raises:
            Unavailable: Redis is down or failed.
        """
        mine = self.state.upstreams[name]
        key = self._key("registry", name)
        raw = await self.link.run("registry", lambda: self.link.client.get(key))
        if raw is None or self.state.upstreams.get(name) is not mine:
            return False  # none, or a reload started it over meanwhile (another identity's key)
        mac, data = (raw[:MAC_BYTES], raw[MAC_BYTES:]) if isinstance(raw, bytes) else (b"", b"")
        if not self.keys.verify(data, mac, "state"):
            self.link.metrics.cluster_errors.labels("forged_registry").inc()
            log.warning("shared tier: the registry state of %s is not MAC'd with this cluster's secret; ignored", name)
            return False
        try:
            shared = _STATE.validate_json(data)
        except ValidationError:
            self.link.metrics.cluster_errors.labels("corrupt_registry").inc()
            log.warning("shared tier: the registry state of %s does not validate; ignored", name)
            return False
        if shared.name != name or len(shared.observed) > MAX_VERSIONS or len(shared.advertised) > MAX_VERSIONS:
            return False
        for f in dataclasses.fields(UpstreamState):
            setattr(mine, f.name, getattr(shared, f.name))
        return True

    async def post_observed(self, name: str, version: str) -> None:
        """Tell the holder that ``version`` worked for ``name`` here.

        Raises:
            Unavailable: Redis is down or failed.
        """
        mailbox = self._key("observed", name)

        async def post() -> None:
            async with self.link.client.pipeline(transaction=True) as pipe:
                pipe.sadd(mailbox, version)
                pipe.pexpire(mailbox, int(STATE_TTL_S * 1000))
                await pipe.execute()

        await self.link.run("registry", post)
