"""``subscriptions/listen`` on ``POST /mcp``: served from the gateway's own listen streams.

No upstream stream is opened for a client. The registry holds one listen stream per member (on
one replica of a cluster), and every list change it hears reaches every process as an
invalidation (:class:`~gateway.cache.Invalidation`, reason ``notification``; ``stream_lost`` when a
stream ended without its result and changes may have been missed). The hub hears each one in
this process (it is the store's ``on_purge``: :class:`~gateway.cache.MemoryStore`) and tells
each listening client that asked for that kind of change (MCP 2026-07-28,
basic/patterns/subscriptions: the acknowledgement first, then only the notifications asked for,
each with the listen request's id as ``subscriptionId``; the graceful end is the listen
request's result).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from aiohttp import web

from ..cache import CacheKey, Invalidation
from ..codec import dumps
from ..config import GatewayConfig
from ..errors import Overloaded
from ..jsonrpc import result_body

__all__ = ["KEEPALIVE_S", "ListenHub"]

SUBSCRIPTION_ID_KEY: Final = "io.modelcontextprotocol/subscriptionId"
#: A comment line this often keeps an idle stream's proxies and clients from timing it out.
KEEPALIVE_S: Final = 15.0
#: Changes heard within this long of the first are told as one notification: one change can
#: reach a process more than once (its own purge and the cluster's echo of it; with --workers,
#: each worker's own stream and the other's bus message), in seconds.
SETTLE_S: Final = 0.2
#: Filter flag -> (the list methods whose change it is about, the notification it asks for).
FLAGS: Final[Mapping[str, tuple[frozenset[str], str]]] = {
    "toolsListChanged": (frozenset({"tools/list"}), "notifications/tools/list_changed"),
    "promptsListChanged": (frozenset({"prompts/list"}), "notifications/prompts/list_changed"),
    "resourcesListChanged": (
        frozenset({"resources/list", "resources/templates/list"}),
        "notifications/resources/list_changed",
    ),
}
#: Invalidation reasons that mean a member's lists changed, or may have (``stream_lost``: a
#: member's stream ended without its result; ``cluster``: this process lost the shared event feed;
#: ``reload``: a reload removed a member or changed what it answers).
_CHANGES: Final = frozenset({"notification", "stream_lost", "cluster", "reload"})


class _Client:
    """One client's stream: its id, the flags it was granted, the kinds of change waiting to be
    sent (a set: however many changes come while it is being written to, at most one
    notification of each kind waits), and whether the gateway is ending it."""

    def __init__(self, request_id: object, flags: Collection[str], members: Collection[str] | None = None) -> None:
        self.request_id = request_id
        self.flags = flags
        #: The members the client may see (``None``: every member); changes of others are not told.
        self.members = members
        self.pending: set[str] = set()
        self.ending = False
        self.wake = asyncio.Event()

    def tell(self, flag: str | None) -> None:
        """A change of kind ``flag`` to send; ``None``: end the stream."""
        if flag is None:
            self.ending = True
        else:
            self.pending.add(flag)
        self.wake.set()

    def event(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        """An SSE event of notification ``method`` on this subscription."""
        body = {**(params or {}), "_meta": {SUBSCRIPTION_ID_KEY: self.request_id}}
        return b"event: message\ndata: " + dumps({"jsonrpc": "2.0", "method": method, "params": body}) + b"\n\n"


class ListenHub:
    """The listening clients of ``/mcp``; ``members`` are the upstreams whose changes count."""

    def __init__(self, members: Collection[str], max_streams: int, write_timeout_s: float) -> None:
        self.members = frozenset(members)
        self.max_streams = max_streams
        self.write_timeout_s = write_timeout_s
        self.clients: set[_Client] = set()

    @classmethod
    def of(cls, config: GatewayConfig) -> ListenHub:
        """The hub of ``config``'s ``[aggregate]`` (which must be there): its members, its bound on
        streams, the listener's write timeout (seconds)."""
        settings = config.aggregate
        assert settings is not None
        return cls(config.aggregate_members(), settings.max_listen_streams, config.listener.write_timeout_s)

    def purged(self, predicate: Callable[[CacheKey], bool], reason: str) -> None:
        """A :class:`~gateway.cache.MemoryStore` ``on_purge`` listener: a member's list changed."""
        if reason not in _CHANGES or not self.clients:
            return
        # Anything but an Invalidation is "every entry": every list may have changed.
        upstream, changed = (
            (predicate.upstream, predicate.methods) if isinstance(predicate, Invalidation) else (None, None)
        )
        if upstream is not None and upstream not in self.members:
            return
        for flag, (methods, _) in FLAGS.items():
            if changed is None or methods & set(changed):
                for client in self.clients:
                    if flag in client.flags and (
                        upstream is None or client.members is None or upstream in client.members
                    ):
                        client.tell(flag)

    def granted(self, requested: object, offered: Collection[str]) -> dict[str, bool]:
        """The part of a client's filter this hub honours: the list flags some member can report
        (``offered``); ``resourceSubscriptions`` and unknown fields are left out."""
        if not isinstance(requested, dict):
            return {}
        return {flag: True for flag in FLAGS if requested.get(flag) is True and flag in offered}

    async def serve(
        self,
        request: web.Request,
        request_id: object,
        requested: object,
        offered: Collection[str],
        cache_status: str,
        members: Collection[str] | None = None,
        ends_at: float | None = None,
    ) -> web.StreamResponse:
        """Answer a listen request: the acknowledgement, then the changes until the client goes
        away, the gateway shuts down, a reload changes who may see what (:meth:`end_all`), or
        ``ends_at`` (event-loop seconds: when the caller's token expires) comes; then the listen
        result, and the stream ends. The stream's ``Cache-Status`` is ``cache_status``;
        ``members``: the members the client may see (per-caller policy; ``None``: all), the only
        ones whose changes it is told.

        Raises:
            Overloaded: ``max_listen_streams`` clients are listening (HTTP 503).
        """
        if len(self.clients) >= self.max_streams:
            raise Overloaded(
                f"/mcp has {len(self.clients)} listen streams open; retry later",
                request_id=request_id,
                headers={"Retry-After": "1"},
            )
        granted = self.granted(requested, offered)
        client = _Client(request_id, granted, None if members is None else frozenset(members))
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        out.headers["X-Accel-Buffering"] = "no"
        out.headers["Cache-Status"] = cache_status
        self.clients.add(client)
        try:
            await out.prepare(request)
            await self._send(
                request, out, client.event("notifications/subscriptions/acknowledged", {"notifications": granted})
            )
            loop = asyncio.get_running_loop()
            while not client.ending:
                left = math.inf if ends_at is None else ends_at - loop.time()
                if left <= 0:
                    break  # the caller's token expired: it listens again with a fresh one
                try:
                    await asyncio.wait_for(client.wake.wait(), min(KEEPALIVE_S, left))
                except TimeoutError:
                    await self._send(request, out, b": keep-alive\n\n")
                    continue
                if not client.ending:
                    await asyncio.sleep(SETTLE_S)  # the echoes of this change arrive meanwhile
                client.wake.clear()
                due, client.pending = client.pending, set()
                for name in FLAGS:
                    if name in due:
                        await self._send(request, out, client.event(FLAGS[name][1]))
            result = {"resultType": "complete", "_meta": {SUBSCRIPTION_ID_KEY: request_id}}
            final = result_body(request_id, result)
            await self._send(request, out, b"event: message\ndata: " + final + b"\n\n")
            await out.write_eof()
        except ConnectionResetError:
            pass  # the client went away: its subscription ends with it
        finally:
            self.clients.discard(client)
        return out

    async def _send(self, request: web.Request, out: web.StreamResponse, data: bytes) -> None:
        """Write ``data`` within the write deadline; a client that stops reading is dropped.

        Raises:
            ConnectionResetError: the client went away or stopped reading.
        """
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await out.write(data)
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("the client stopped reading") from None

    def end_all(self) -> None:
        """End every stream gracefully (a reload that changes ``[auth]`` or the rules: each
        client listens again under the new ones)."""
        for client in self.clients:
            client.tell(None)

    def close(self) -> None:
        """End every stream gracefully (the app's shutdown)."""
        self.end_all()
