"""One member's part of a composed answer of ``POST /mcp``: every page of its answer, bounded.

A member's pages are followed one after another (each cursor from the page before), all of them
within the member's ``timeout_s``, up to ``max_member_pages`` and the member's
``max_response_bytes`` in all, and never round a cursor loop; the pages come through the cache
(:mod:`.parts`). A member that fails is left out of the answer; one cut short keeps what was read.
Either way the answer is incomplete: ``ttlMs`` 0, not stored (:mod:`.compose`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Final

from ..codec import dumps
from ..protocol import ParsedRequest, method_label
from ..proxy.exchange import Exchange
from ..telemetry import GatewayMetrics
from ..upstream import Upstream
from .compose import LIST_FIELDS, MemberList, Part, exposed_items
from .names import Names, quoted
from .parts import MemberError, MemberFailed, PartFetcher
from .rewrite import with_cursor

__all__ = ["MemberCollector"]

log = logging.getLogger("mcp_gateway.aggregate")

#: A member's problems are logged at most once this often, in seconds.
LOG_EVERY_S: Final = 10.0


class MemberCollector:
    """Collects members' parts through ``parts`` (:class:`~.parts.PartFetcher`), naming their
    items with ``names``."""

    def __init__(
        self,
        upstreams: Mapping[str, Upstream],
        metrics: GatewayMetrics,
        parts: PartFetcher,
        names: Names,
        max_member_pages: int,
    ) -> None:
        self.upstreams = upstreams
        self.metrics = metrics
        self.parts = parts
        self.names = names
        self.max_member_pages = max_member_pages
        #: Per member: when its last line was logged, and how many lines were not since.
        self._logged: dict[str, tuple[float, int]] = {}

    async def collect(self, name: str, ex: Exchange, parsed: ParsedRequest) -> MemberList:
        """Member ``name``'s part of the answer to ``parsed``: every page of it (:meth:`pages`),
        all within the member's ``timeout_s``, and for a list its items under their exposed
        names. A member that fails, or whose items cannot be written back as JSON, is left out
        (the others are still answered); one whose pages are cut short keeps what was read."""
        upstream = self.upstreams[name]
        timeout_s = upstream.config.timeout_s
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                got = await self.pages(upstream, ex, parsed, deadline)
        except TimeoutError:
            got = MemberList([], False, f"its pages took longer than its timeout_s ({timeout_s:g} s)")
        except (*MemberFailed, MemberError) as err:
            got = MemberList([], False, err.message)
        method = parsed.method or ""
        if method in LIST_FIELDS and got.parts:
            got.items = [
                item
                for part in got.parts
                for item in exposed_items(method, name, part.result.get(LIST_FIELDS[method]), self.names)
            ]
            try:
                got.rendered = dumps(got.items)
            except ValueError:  # a number beyond the float range, or nesting too deep to write
                got = MemberList([], False, "its list cannot be written back as JSON")
        if got.problem is not None:
            outcome = "cut_short" if got.parts else "left_out"
            self.metrics.aggregate_parts_missing.labels(name, method_label(method), outcome).inc()
            self._log(name, method, got)
        return got

    def _log(self, name: str, method: str, got: MemberList) -> None:
        """Say why ``name`` was left out or cut short: once per member per :data:`LOG_EVERY_S`
        (every list request to ``/mcp`` meets a dead member again), with how many were not said."""
        now = time.monotonic()
        last, unsaid = self._logged.get(name, (-LOG_EVERY_S, 0))
        if now - last < LOG_EVERY_S:
            self._logged[name] = (last, unsaid + 1)
            return
        self._logged[name] = (now, 0)
        more = f" ({unsaid} more times since the last line)" if unsaid else ""
        if got.parts:
            log.info("/mcp: %s's %s cut short: %s%s", name, method, got.problem, more)
        else:
            log.info("/mcp: left %s out of a %s answer: %s%s", name, method, got.problem, more)

    async def pages(
        self, upstream: Upstream, ex: Exchange, parsed: ParsedRequest, deadline: asyncio.Timeout
    ) -> MemberList:
        """The pages of ``upstream``'s answer to ``parsed`` (one for ``server/discover``), each
        request the caller's body with only ``params.cursor`` changed. Cut short (incomplete)
        after ``max_member_pages``, at a cursor already followed, or past the member's
        ``max_response_bytes`` in all. Time a page's lookup waited on the shared tier moves
        ``deadline`` (the member's ``timeout_s``) on: a slow Redis must not cost a member its place.

        Raises:
            BadGateway, GatewayTimeout, Overloaded, MemberError: a page could not be had.
        """
        params = {k: v for k, v in (parsed.params or {}).items() if k != "cursor"}
        assert ex.body is not None
        body = ex.body if "cursor" not in (parsed.params or {}) else with_cursor(ex.body, None)
        parts: list[Part] = []
        followed: set[str] = set()
        size = 0
        budget = upstream.config.max_response_bytes
        for _ in range(self.max_member_pages):
            member_parsed = ParsedRequest(
                "request", parsed.request_id, parsed.method, parsed.era, parsed.version, params, parsed.cache_bypass
            )
            part = await self.parts.fetch(upstream, member_parsed, body, ex.request)
            parts.append(part)
            size += part.size
            if part.waited_s and (when := deadline.when()) is not None:
                deadline.reschedule(when + part.waited_s)
            cursor = part.result.get("nextCursor") if parsed.method != "server/discover" else None
            if type(cursor) is not str:
                return MemberList(parts, not any(p.stale for p in parts))
            if cursor in followed:
                return MemberList(parts, False, f"its nextCursor {quoted(cursor)} came back again")
            if size > budget:
                return MemberList(parts, False, f"its pages are over its max_response_bytes ({budget}) together")
            followed.add(cursor)
            params = {**params, "cursor": cursor}
            body = with_cursor(body, cursor)
        return MemberList(parts, False, f"it has more than max_member_pages ({self.max_member_pages}) pages")
