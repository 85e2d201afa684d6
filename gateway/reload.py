"""Config reload without a restart: ``SIGHUP``, or ``POST /admin/reload``.

The file is read and validated with the code of ``check-config`` (:func:`gateway.config.read_config`,
``${ENV}`` and ``${file:PATH}`` read again); an invalid file changes nothing. A valid one is
compared with the config served (:func:`diff_configs`) and applied in one step, with no await in
it, so that no request runs in the middle of it: the upstream clients, the registry, the next
generation (:mod:`gateway.generation`), the swap, then the entries that must go and the cache's new
bounds. A request keeps the generation it began with to its end.

By upstream: an **added** one is probed at once and served; a **removed** one answers unknown
upstream (HTTP 404, -32601) and its entries go; a **changed** one (an answer-changing setting:
:func:`answer_settings`) loses its entries and starts over in the registry; a **retuned** one (any
other setting: timeouts, stale window, bounds) keeps its entries, probe state and listen stream,
and its new settings apply from the next request. ``[auth]``, ``[admin].token``, ``[cache]`` and
``[aggregate]`` apply from the next request (a smaller ``max_entries`` evicts down to it at once;
``/mcp``'s composed answers go when its members or ``[aggregate]`` change).
``[listener]``, ``[cluster]`` and ``[registry]``, and adding or removing ``[admin]`` or
``[aggregate]``, need a restart: the rest is applied, and the answer and the log line name the keys
that were not (:attr:`ConfigDiff.not_applied`).

In a ``--workers`` group each worker reloads its own copy, reading the file itself: ``SIGHUP`` to
the parent is passed on to every worker, and ``POST /admin/reload`` on one worker reloads it and
then has the parent pass ``SIGHUP`` on to the others (:meth:`Reloader.reload_group`,
``gateway.cli``). A worker whose reload fails keeps its config; ``mcp_gateway_config_info``
shows every config some worker serves.

With ``[cluster]``, each replica reloads its own file, whenever it changes there: an upstream's
shared entries, locks, generations and lease are named by its identity
(:meth:`~gateway.cluster.mac.Keys.identity`, of the same settings as :func:`answer_settings`), so
a changed one gets a new identity, whose entries a replica still on the old file never reads,
nor the other way round; an unchanged one keeps its identity, and shares with every replica, on
either file. The entries that go, go from this process only (the others may still serve the old
file), and its lease follows (:meth:`~gateway.cluster.Cluster.reload`, :meth:`Registry.reload
<gateway.registry.Registry.reload>`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from .aggregate import ROUTE
from .cache import Invalidation, MemoryStore
from .config import ConfigError, GatewayConfig, LoadedConfig
from .generation import AppParts, Live, build_generation
from .telemetry import GatewayMetrics
from .upstream import Upstream

__all__ = ["ConfigDiff", "Reload", "Reloader", "answer_settings", "applicable", "diff_configs", "track_upstream"]

log = logging.getLogger("mcp_gateway.reload")

#: Tables applied only at start: a reload keeps the running ones and names what differs.
RESTART_TABLES: Final = ("listener", "cluster", "registry")
#: Optional tables whose presence is fixed at start (their routes exist or not); their contents reload.
FIXED_PRESENCE: Final = ("admin", "aggregate")
#: The tables besides ``upstreams`` that a reload applies, named in its answer when they change.
RELOADED_TABLES: Final = ("auth", "policy", "cache", "admin", "aggregate")
#: With ``[cluster]``, how long ``POST /admin/reload`` waits for new identities to be shared, in seconds.
SETTLE_S: Final = 2.0


def answer_settings(config: GatewayConfig, name: str) -> tuple[object, ...]:
    """What may change upstream ``name``'s answers under one cache key: its ``url``, ``headers``,
    ``forward_authorization`` and (with the ``[cache]`` default) ``vary_on_client_capabilities``.
    An upstream whose settings differ here after a reload loses its entries."""
    up = config.upstreams[name]
    return (str(up.url), sorted(up.headers.items()), up.forward_authorization, config.vary_on_capabilities(name))


@dataclass(frozen=True, slots=True)
class ConfigDiff:
    """What a reload from one config to another does, by upstream name (each in config order),
    ``tables``: the other tables whose settings it changes (``auth``, ``policy``, ``cache``,
    ``admin``, ``aggregate``), and ``not_applied``: the dotted keys (``listener.port``,
    ``cluster``) it leaves as they are."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    retuned: tuple[str, ...] = ()
    not_applied: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()

    @property
    def fresh(self) -> tuple[str, ...]:
        """The upstreams that start over: no entries, probed at once."""
        return self.added + self.changed

    @property
    def dropped(self) -> tuple[str, ...]:
        """The upstreams whose entries go."""
        return self.removed + self.changed


def diff_configs(running: GatewayConfig, new: GatewayConfig) -> ConfigDiff:
    """What reloading ``new`` over ``running`` does (no I/O; see the module)."""
    added = tuple(name for name in new.upstreams if name not in running.upstreams)
    removed = tuple(name for name in running.upstreams if name not in new.upstreams)
    kept = [name for name in new.upstreams if name in running.upstreams]
    changed = tuple(name for name in kept if answer_settings(running, name) != answer_settings(new, name))
    retuned = tuple(name for name in kept if name not in changed and running.upstreams[name] != new.upstreams[name])
    tables = tuple(t for t in RELOADED_TABLES if getattr(running, t) != getattr(new, t))
    return ConfigDiff(added, removed, changed, retuned, _not_applied(running, new), tables)


def _not_applied(running: GatewayConfig, new: GatewayConfig) -> tuple[str, ...]:
    keys: list[str] = []
    for table in RESTART_TABLES:
        before, after = getattr(running, table), getattr(new, table)
        if before == after:
            continue
        if not isinstance(before, BaseModel) or not isinstance(after, BaseModel):
            keys.append(table)  # added or removed
            continue
        differ = [key for key in type(before).model_fields if getattr(before, key) != getattr(after, key)]
        keys.extend(f"{table}.{key}" for key in differ)
    keys.extend(table for table in FIXED_PRESENCE if (getattr(running, table) is None) != (getattr(new, table) is None))
    return tuple(keys)


def applicable(running: GatewayConfig, new: GatewayConfig) -> GatewayConfig:
    """``new`` with what a reload cannot change taken from ``running`` (see the module).

    Raises:
        ConfigError: the two do not go together (``[aggregate]`` kept from ``running`` names an
            upstream ``new`` no longer has), naming the key.
    """
    kept: dict[str, Any] = {
        table: getattr(running, table) for table in RESTART_TABLES if getattr(running, table) != getattr(new, table)
    }
    for table in FIXED_PRESENCE:
        if (getattr(running, table) is None) != (getattr(new, table) is None):
            kept[table] = getattr(running, table)
    if not kept:
        return new
    try:
        return GatewayConfig.model_validate({name: getattr(new, name) for name in GatewayConfig.model_fields} | kept)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        tables = ", ".join(f"[{table}]" for table in kept)
        raise ConfigError(f"cannot be applied without a restart, with the running {tables}: {problems}") from exc


@dataclass(frozen=True, slots=True)
class Reload:
    """The outcome of one reload: ``error`` (``None``: applied), ``sha256`` of the config served
    afterwards, ``diff`` (applied only), ``status``: the HTTP status ``POST /admin/reload`` answers."""

    sha256: str | None
    diff: ConfigDiff | None = None
    error: str | None = None
    status: int = 200

    def to_json(self) -> dict[str, Any]:
        """The body of ``POST /admin/reload``."""
        if self.error is not None:
            return {"reloaded": False, "error": self.error, "config_sha256": self.sha256}
        assert self.diff is not None
        body: dict[str, Any] = {"reloaded": True, "config_sha256": self.sha256}
        for name in ("added", "removed", "changed", "retuned", "tables", "not_applied"):
            body[name] = list(getattr(self.diff, name))
        if self.diff.not_applied:
            body["detail"] = f"not applied, a restart needed: {', '.join(self.diff.not_applied)}"
        return body


class Reloader:
    """Reloads ``live`` from ``source`` (the config file, read and validated anew at each call),
    over the app's ``parts`` and ``store``. ``refused``: why this process cannot reload (then
    every reload fails with it, HTTP 409). ``group``: in a ``--workers`` group, asks the parent to
    have the other workers reload (returns at once; their outcomes are theirs)."""

    def __init__(
        self,
        parts: AppParts,
        live: Live,
        store: MemoryStore,
        source: Callable[[], LoadedConfig] | None,
        *,
        refused: str | None = None,
        group: Callable[[], object] | None = None,
    ) -> None:
        self.parts = parts
        self.live = live
        self.store = store
        self.source = source
        self.refused = refused
        self.group = group
        if source is None and refused is None:
            self.refused = "this gateway was not started from a config file"
        parts.metrics.config_reloads.labels("ok")  # both series exist from the start (0)
        parts.metrics.config_reloads.labels("failed")
        parts.metrics.serve_config(None, live.generation.sha256)

    def reload(self) -> Reload:
        """Read the config again and apply it (see the module). A file that cannot be applied
        raises nothing: it is the outcome's ``error``. The outcome is logged (an error when
        nothing changed, a warning when keys were not applied) and counted in
        ``mcp_gateway_config_reloads_total{outcome}``."""
        serving = self.live.generation.sha256
        if self.refused is not None:
            return self._failed(Reload(serving, error=f"config reload is not available: {self.refused}", status=409))
        if self.parts.session is None:
            stopped = "config reload is not available: the gateway is not running"
            return self._failed(Reload(serving, error=stopped, status=409))
        assert self.source is not None
        try:
            loaded = self.source()  # check-config's code: its message, after its "mcp-gateway: "
        except ConfigError as exc:
            return self._failed(Reload(serving, error=f"invalid config: {exc}", status=400))
        running = self.live.generation.config
        diff = diff_configs(running, loaded.config)
        try:
            config = applicable(running, loaded.config)
        except ConfigError as exc:
            return self._failed(Reload(serving, error=str(exc), status=400))
        started = time.perf_counter()
        self._apply(config, loaded.sha256, diff)
        took_ms = (time.perf_counter() - started) * 1000
        self.parts.metrics.config_reloads.labels("ok").inc()
        level = logging.WARNING if diff.not_applied else logging.INFO
        log.log(
            level,
            "config reloaded (sha256 %s, applied in %.1f ms): added %s, removed %s, changed %s, retuned %s, "
            "tables %s%s",
            loaded.sha256,
            took_ms,
            list(diff.added),
            list(diff.removed),
            list(diff.changed),
            list(diff.retuned),
            list(diff.tables),
            f"; not applied, a restart needed: {', '.join(diff.not_applied)}" if diff.not_applied else "",
        )
        return Reload(loaded.sha256, diff)

    def reload_group(self) -> Reload:
        """:meth:`reload` here, then the other workers of the group (``group``), unless this
        process cannot reload at all (409): they read the same file, so an invalid one fails in
        each and changes nothing anywhere. The outcome is this process's."""
        outcome = self.reload()
        if self.group is not None and outcome.status != 409:
            self.group()
        return outcome

    async def settled(self) -> bool:
        """With ``[cluster]``: wait until the upstreams the last reload gave a new identity are
        shared (their generations read from Redis), at most :data:`SETTLE_S`; whether they are
        (else they are shared once Redis answers). Without: ``True`` at once."""
        cluster = self.parts.cluster
        return cluster is None or await cluster.generations.settled(SETTLE_S)

    def _failed(self, outcome: Reload) -> Reload:
        self.parts.metrics.config_reloads.labels("failed").inc()
        log.error("config reload failed, still serving the config of sha256 %s: %s", outcome.sha256, outcome.error)
        return outcome

    def _apply(self, config: GatewayConfig, sha256: str, diff: ConfigDiff) -> None:
        """One step, no await: no request starts in the middle of it."""
        parts, old = self.parts, self.live.generation
        metrics, session = parts.metrics, parts.session
        assert session is not None
        upstreams: dict[str, Upstream] = {}
        for name, up_config in config.upstreams.items():
            before = old.upstreams.get(name)
            if before is None or name in diff.changed:
                upstream = upstreams[name] = Upstream(name, up_config, session)
                track_upstream(metrics, upstream)
            else:
                upstreams[name] = before if before.config == up_config else before.retuned(up_config)
        if parts.cluster is not None:
            parts.cluster.reload(config)  # identities first: the registry's leases are named by them
        parts.registry.reload(config, upstreams, fresh=diff.fresh)
        if parts.hub is not None and config.aggregate is not None:
            parts.hub.members = frozenset(config.aggregate_members())
            parts.hub.max_streams = config.aggregate.max_listen_streams
        # Before the next generation: the requests of this one and older ones then store nothing
        # of the dropped upstreams (fetched the old way), even those that read no entry yet.
        parts.readthrough.drop(diff.dropped)
        self.live.swap(build_generation(parts, config, sha256, upstreams, previous=old))
        # After the swap: a request that began before it and stores an answer after this purge
        # is refused by the store's purge count (the read-through's Lead.purges). With [cluster],
        # here only: the other replicas reload their own file, when it reaches them.
        dropped = set(diff.dropped)
        # Nor may a request made from now on join a fetch begun with the old url or headers.
        parts.readthrough.coalescer.detach(lambda key: key.upstream in dropped)
        drop = self.store.purge if parts.cluster is not None else parts.invalidator.invalidate_soon
        for name in diff.dropped:
            drop(Invalidation(name), "reload")
        running = old.config
        if config.aggregate is not None and (
            running.aggregate != config.aggregate or running.aggregate_members() != config.aggregate_members()
        ):
            # A composed answer stays current while its parts do: one made of fewer members, or
            # under another separator, would.
            drop(Invalidation(ROUTE), "reload")
        if parts.hub is not None:
            members_then = set(running.aggregate_members()) if running.aggregate is not None else set()
            members_now = set(config.aggregate_members()) if config.aggregate is not None else set()
            if members_then != members_now:
                # /mcp's lists changed: its listening clients are told. (A changed member is told
                # of by its own drop above; a removed one is no member of the hub's any more.)
                parts.hub.purged(lambda _key: True, "reload")
        if "auth" in diff.tables or "policy" in diff.tables:
            # An open listen stream was authorized under the old [auth] and rules: each one ends,
            # and its client listens again under the new ones.
            old.proxy.forwarder.end_listening()
            if parts.hub is not None:
                parts.hub.end_all()
        metrics.serving(config.upstreams)  # in a group, a removed upstream's gauges leave the scrape
        for name in diff.removed:
            metrics.untrack_inflight(name)
        cache = config.cache
        self.store.resize(
            max_entries=cache.max_entries,
            max_bytes=cache.max_bytes,
            keep_stale=any(config.stale_if_error_ms(name) > 0 for name in config.upstreams),
        )
        metrics.serve_config(old.sha256, sha256)


def track_upstream(metrics: GatewayMetrics, upstream: Upstream) -> None:
    """``mcp_gateway_inflight_requests{upstream}`` reads ``upstream``'s count when scraped."""
    metrics.track_inflight(upstream.name, lambda: upstream.inflight)
