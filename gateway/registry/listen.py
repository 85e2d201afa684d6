"""The listen stream: the gateway's own ``subscriptions/listen`` to one modern upstream.

:class:`ListenStream` holds one per upstream that advertises ``listChanged`` or
``resources.subscribe``, under the gateway's own identity; its notifications purge cache entries
(MCP 2026-07-28, basic/patterns/subscriptions; server/utilities/caching, 'Interaction with
Notifications'). Each HTTP request it sends is a :class:`_Stream`. Every pause goes through the
injected ``sleep``, so tests move time instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import aiohttp

from ..cache import Invalidation, invalidation
from ..config import RegistryConfig
from ..errors import GatewayError
from ..jsonrpc import error_code, response_id_matches
from ..protocol import MODERN_VERSION, MODERN_VERSIONS
from ..sse import SSEParser
from ..upstream import Upstream
from .probe import Rng, backoff_delay, json_or_none, modern_headers, modern_request
from .state import UpstreamState

__all__ = ["LISTEN_RESYNC_S", "RESUBSCRIBE_AFTER_GRACEFUL_S", "ListenStream", "Sleep"]

log = logging.getLogger("mcp_gateway.registry")

SUBSCRIPTION_ID_KEY: Final = "io.modelcontextprotocol/subscriptionId"
#: Delay before re-subscribing after an upstream ended a listen stream gracefully, in seconds.
RESUBSCRIBE_AFTER_GRACEFUL_S: Final = 1.0
#: How often a held listen stream is checked against what should be subscribed, in seconds.
LISTEN_RESYNC_S: Final = 2.0

#: ``sleep(seconds)``: ``asyncio.sleep``, or a test's fake.
Sleep = Callable[[float], Awaitable[None]]


async def _pause(
    sleep: Sleep, delay: float, wake: asyncio.Event | None = None, until: asyncio.Future[Any] | None = None
) -> None:
    """Sleep ``delay`` seconds through ``sleep``, ending early when ``wake`` is set or the task
    ``until`` ends (``until`` is only watched, never cancelled)."""
    if wake is None and until is None:
        await sleep(delay)
        return
    ours: list[asyncio.Future[Any]] = [asyncio.ensure_future(sleep(delay))]
    if wake is not None:
        ours.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait([*ours, until] if until is not None else ours, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in ours:
            fut.cancel()
        await asyncio.gather(*ours, return_exceptions=True)


class _Stream:
    """One ``subscriptions/listen`` request of a :class:`ListenStream` and its SSE answer, run as a task.

    ``outcome`` once done: ``graceful`` (the listen result came, MCP 2026-07-28,
    basic/patterns/subscriptions, 'Graceful Closure'), ``lost`` (acknowledged, then ended without
    the result), ``refused`` (never acknowledged), ``closed`` (we cancelled it).
    """

    def __init__(self, owner: ListenStream, filt: Mapping[str, Any], request_id: str) -> None:
        self.owner = owner
        self.filter = filt
        self.request_id = request_id
        self.acked = asyncio.Event()
        self.honoured: Mapping[str, Any] | None = None
        self.outcome = "closed"
        self.detail: str | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        owner = self.owner
        up = owner.upstream
        body = modern_request(
            "subscriptions/listen", self.request_id, {"notifications": dict(self.filter)}, owner.version
        )
        headers = modern_headers(up, "subscriptions/listen", owner.version)
        try:
            # A bound on the upstream's answer (real time, like every upstream timeout), not a pause.
            async with asyncio.timeout(owner.ack_timeout_s) as deadline:
                async with up.open("POST", body, headers) as resp:
                    await self._read(resp, deadline)
        except TimeoutError:
            self._end("refused", f"no acknowledgement within {owner.ack_timeout_s:g} s")
        except GatewayError as err:
            self._end("lost", err.message)
        except asyncio.CancelledError:
            self._end("closed", None)
            raise
        except Exception as exc:  # a bug here must read as a broken stream, never end silently
            log.exception("upstream %s: listen stream failed", up.name)
            self._end("lost", f"listen stream failed ({type(exc).__name__})")

    def _end(self, outcome: str, detail: str | None) -> None:
        if outcome == "lost" and not self.acked.is_set():
            outcome = "refused"
        self.outcome, self.detail = outcome, detail

    async def _read(self, resp: aiohttp.ClientResponse, deadline: asyncio.Timeout) -> None:
        up = self.owner.upstream
        if resp.status != 200 or resp.content_type != "text/event-stream":
            loop = asyncio.get_running_loop()
            code = error_code(json_or_none(await up.read_body(resp, loop.time() + up.config.timeout_s)))
            got = f"JSON-RPC error {code}" if code is not None else f"{resp.content_type} body"
            self._end("refused", f"answered HTTP {resp.status} with {got}, not an event stream")
            return
        parser = SSEParser(up.config.max_response_bytes)
        async for chunk in up.iter_stream(resp):
            for data in parser.feed(chunk):
                if self._handle(json_or_none(data), deadline):
                    return
            if parser.overflowed:
                self._end("lost", "an event exceeded max_response_bytes")
                return
        self._end("lost", "the stream ended without the subscriptions/listen result")

    def _handle(self, message: object, deadline: asyncio.Timeout) -> bool:
        """Act on one message; ``True`` when the stream is over."""
        if not isinstance(message, dict):
            return False
        method = message.get("method")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        meta = params.get("_meta")
        sub_id = meta.get(SUBSCRIPTION_ID_KEY) if isinstance(meta, dict) else None
        if not self.acked.is_set():
            if method == "notifications/subscriptions/acknowledged" and sub_id == self.request_id:
                honoured = params.get("notifications")
                self.honoured = honoured if isinstance(honoured, dict) else {}
                deadline.reschedule(None)  # acknowledged: from now on only the idle timeout applies
                self.acked.set()
                return False
            self._end("refused", f"first message was {method or 'a response'}, not the acknowledgement")
            return True
        if method is None:
            if response_id_matches(message, self.request_id):
                if "result" in message:
                    self._end("graceful", None)
                else:
                    self._end("lost", f"ended with JSON-RPC error {error_code(message)}")
                return True
            return False
        if isinstance(method, str) and (sub_id is None or sub_id == self.request_id):
            self.owner.notified(method, params)
        return False


class ListenStream:
    """Holds the gateway's own listen stream to one modern upstream (MCP 2026-07-28,
    basic/patterns/subscriptions).

    The filter comes from the last discover: ``toolsListChanged``/``promptsListChanged``/
    ``resourcesListChanged`` where the capability advertises ``listChanged``, and
    ``resourceSubscriptions`` for the URIs of this upstream's cached ``resources/read`` entries
    where ``resources.subscribe`` is advertised. When more URIs get cached, a wider stream is
    opened and, once acknowledged, replaces the old one (no gap). When a stream ends without the
    graceful result, all of this upstream's entries are purged (reason ``stream_lost``):
    notifications may have been missed, and there is no replay. Entries stored while no stream
    was held after such a break are purged again when the next stream is acknowledged.
    Re-subscribing after failures backs off exponentially with jitter. ``wake.set()`` makes it
    reconsider the stream now (the registry does so when a probe saw a change).
    """

    def __init__(
        self,
        upstream: Upstream,
        state: UpstreamState,
        settings: RegistryConfig,
        *,
        purge: Callable[[Invalidation, str], int],
        cached_uris: Callable[[str], tuple[str, ...]],
        sleep: Sleep,
        rng: Rng,
    ) -> None:
        self.upstream = upstream
        self.state = state
        self.settings = settings
        self.ack_timeout_s = settings.probe_timeout_s
        self.version = MODERN_VERSION
        self.wake = asyncio.Event()
        self._purge = purge
        self._cached_uris = cached_uris
        self._sleep = sleep
        self._rng = rng
        self._ids = itertools.count(1)
        self._active: _Stream | None = None
        self._failures = 0
        self._covered = True  # False after a break, until a stream is acknowledged again

    def desired_filter(self) -> dict[str, Any] | None:
        """The ``SubscriptionFilter`` to hold now, or ``None`` when no stream is wanted."""
        state = self.state
        caps = state.capabilities
        if state.era != "modern" or not state.up or not isinstance(caps, Mapping):
            return None
        if not any(v in MODERN_VERSIONS for v in state.advertised):
            return None
        filt: dict[str, Any] = {}
        for cap, flag in (("tools", "toolsListChanged"), ("prompts", "promptsListChanged")):
            section = caps.get(cap)
            if isinstance(section, Mapping) and section.get("listChanged") is True:
                filt[flag] = True
        resources = caps.get("resources")
        if isinstance(resources, Mapping):
            if resources.get("listChanged") is True:
                filt["resourcesListChanged"] = True
            if resources.get("subscribe") is True and (uris := self._cached_uris(self.upstream.name)):
                filt["resourceSubscriptions"] = list(uris)
        return filt or None

    def notified(self, method: str, params: Mapping[str, Any]) -> None:
        """A notification arrived on the held stream: purge what it makes stale."""
        predicate = invalidation(self.upstream.name, method, params)
        if predicate is not None:
            count = self._purge(predicate, "notification")
            log.info("upstream %s: %s purged %d cache entries", self.upstream.name, method, count)

    @staticmethod
    def _covers(held: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
        """Whether the held filter asks for everything ``wanted`` asks for."""
        for flag, value in wanted.items():
            if flag == "resourceSubscriptions":
                if not set(value) <= set(held.get(flag, ())):
                    return False
            elif held.get(flag) != value:
                return False
        return True

    async def run(self) -> None:
        """Hold the stream until cancelled. Every wait is bounded (:data:`LISTEN_RESYNC_S`)."""
        try:
            while True:
                try:
                    await self._step()
                except Exception:  # a bug must not end invalidation for good: log, back off, go on
                    log.exception("upstream %s: listen supervisor failed", self.upstream.name)
                    self._failures += 1
                    await _pause(self._sleep, self._backoff())
        finally:
            if self._active is not None:
                await self._close(self._active)
                self._active = None

    async def _step(self) -> None:
        active = self._active
        if active is not None and active.task is not None and active.task.done():
            self._active = None
            await self._ended(active)
            return
        wanted = self.desired_filter()
        listen = self.state.listen
        if wanted is None:
            if active is not None:
                await self._close(active)
                self._active = None
                self._covered = False
            listen.state, listen.requested, listen.honoured, listen.problem = "off", None, None, None
            await self._wait()
            return
        if active is None or not self._covers(active.filter, wanted):
            await self._open(wanted)
            return
        await self._wait(active)

    async def _wait(self, active: _Stream | None = None) -> None:
        """Until :data:`LISTEN_RESYNC_S` seconds pass, the registry wakes us, or ``active`` ends."""
        await _pause(self._sleep, LISTEN_RESYNC_S, self.wake, active.task if active is not None else None)
        self.wake.clear()

    async def _open(self, wanted: Mapping[str, Any]) -> None:
        """Open a stream for ``wanted``; once acknowledged it replaces the held one (if any)."""
        listen = self.state.listen
        old = self._active
        stream = _Stream(self, wanted, f"mcp-gateway-listen-{next(self._ids)}")
        stream.task = asyncio.ensure_future(stream.run())
        listen.streams += 1
        if old is None:
            listen.state, listen.requested = "connecting", dict(wanted)
        ack = asyncio.ensure_future(stream.acked.wait())
        try:
            # No pause: the stream bounds its own wait for the acknowledgement (ack_timeout_s).
            await asyncio.wait((ack, stream.task), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._close(stream)  # not yet ours to close in run()'s finally
            raise
        finally:
            ack.cancel()
            await asyncio.gather(ack, return_exceptions=True)
        if not stream.acked.is_set():
            await stream.task  # it ended without an acknowledgement
            await self._ended(stream, replacing=old is not None)
            return
        self._active = stream
        if old is not None:
            await self._close(old)
        listen.state, listen.requested, listen.honoured, listen.problem = (
            "acknowledged",
            dict(wanted),
            stream.honoured,
            None,
        )
        self._failures = 0
        if not self._covered:
            # Entries stored since the break may have missed a notification.
            self._purge(Invalidation(self.upstream.name), "stream_lost")
            self._covered = True
        log.info("upstream %s: listening for %s (acknowledged %s)", self.upstream.name, dict(wanted), stream.honoured)

    async def _close(self, stream: _Stream) -> None:
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
            await asyncio.gather(stream.task, return_exceptions=True)

    async def _ended(self, stream: _Stream, *, replacing: bool = False) -> None:
        """A stream ended on its own: purge if it was lost, then wait before re-subscribing."""
        listen = self.state.listen
        if stream.outcome == "graceful":
            log.info("upstream %s: listen stream ended gracefully; re-subscribing", self.upstream.name)
            listen.state = "retrying"
            await _pause(self._sleep, RESUBSCRIBE_AFTER_GRACEFUL_S)
            return
        self._failures += 1
        if stream.outcome == "lost":
            listen.losses += 1
            self._covered = False
            count = self._purge(Invalidation(self.upstream.name), "stream_lost")
            log.warning(
                "upstream %s: listen stream lost (%s); purged %d entries", self.upstream.name, stream.detail, count
            )
        else:
            log.warning("upstream %s: subscriptions/listen refused: %s", self.upstream.name, stream.detail)
        if not replacing:
            listen.state, listen.problem = "retrying", stream.detail or stream.outcome
        await _pause(self._sleep, self._backoff(), self.wake)
        self.wake.clear()

    def _backoff(self) -> float:
        settings = self.settings
        return backoff_delay(
            self._failures, base_s=settings.backoff_base_s, max_s=settings.backoff_max_s, rng=self._rng
        )
