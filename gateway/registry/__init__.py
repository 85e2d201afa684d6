"""The live registry of the fleet: who each upstream is, what it offers, which versions it speaks.

Modules, lower first (each imports only those before it; ``views`` only ``state``):

* ``state``: :class:`UpstreamState` per upstream inside :class:`RegistryState`, plain data that
  the probes and listen streams write and the routes read. No I/O.
* ``probe``: :class:`Prober`, the gateway's own ``server/discover`` to an upstream (MCP
  2026-07-28, server/discover), with era detection and the legacy ``initialize`` fallback
  (Streamable HTTP, 'Backward Compatibility'; basic/versioning, 'Backward Compatibility with
  Initialization-Based Versions'), on a schedule from :func:`probe_delay` / :func:`backoff_delay`
  (pure functions; jitter and backoff are a MUST for anyone who polls, MCP 2026-07-28,
  server/utilities/caching, 'Freshness Calculation').
* ``listen``: :class:`ListenStream`, one ``subscriptions/listen`` per modern upstream that
  advertises ``listChanged`` or ``resources.subscribe``, held under the gateway's own identity;
  its notifications purge cache entries (MCP 2026-07-28, basic/patterns/subscriptions;
  server/utilities/caching, 'Interaction with Notifications').
* ``service``: :class:`Registry`, which owns the state and runs the probe loops and listen
  streams as :class:`~gateway.tasks.BackgroundTasks`, started and stopped from the app's
  ``cleanup_ctx``.
* ``views``: :class:`RegistryViews`, ``GET /v0.1/servers`` in the official MCP Registry API shape
  (live state under the ``_meta`` key :data:`LIVE_META_KEY`; ``POST /mcp`` listed as one more
  server, :data:`AGGREGATE_NAME`) and ``GET /registry/versions``.

Probes and listen streams go through :class:`~gateway.upstream.Upstream` (the shared session, the
upstream's configured headers, no redirects, failures mapped there) and never carry anything from
a client's request: no caller's ``Authorization`` can reach them (MCP 2026-07-28,
basic/authorization, 'Token Handling'; Security Best Practices, 'Token Passthrough').
"""

from .listen import LISTEN_RESYNC_S, RESUBSCRIBE_AFTER_GRACEFUL_S, ListenStream
from .probe import PROBE_JITTER, Prober, backoff_delay, classify_discover, classify_initialize, probe_delay
from .service import Registry
from .state import Health, ListenRecord, ProbeRecord, ProbeResult, RegistryState, UpstreamEra, UpstreamState
from .views import AGGREGATE_NAME, LIVE_META_KEY, AggregateListing, RegistryViews

__all__ = [
    "AGGREGATE_NAME",
    "LISTEN_RESYNC_S",
    "LIVE_META_KEY",
    "PROBE_JITTER",
    "RESUBSCRIBE_AFTER_GRACEFUL_S",
    "AggregateListing",
    "Health",
    "ListenRecord",
    "ListenStream",
    "ProbeRecord",
    "ProbeResult",
    "Prober",
    "Registry",
    "RegistryState",
    "RegistryViews",
    "UpstreamEra",
    "UpstreamState",
    "backoff_delay",
    "classify_discover",
    "classify_initialize",
    "probe_delay",
]
