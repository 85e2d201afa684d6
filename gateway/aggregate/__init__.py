"""``POST /mcp``: the fleet as one MCP server, composed from the per-upstream cache.

Modules, lower first: ``names`` (exposed names, URIs and the gateway's cursors), ``rewrite``
(a caller's body for a member, one value changed), ``compose`` (hints, items, discover; no I/O),
``fleet`` (what ``/mcp`` needs of the per-upstream routes), ``parts`` (one member's answer
through the cache), ``members`` (a member's pages, bounded),
``listen`` (the listening clients), ``handler`` (the route).
"""

from .handler import ROUTE, Aggregate
from .listen import ListenHub

__all__ = ["ROUTE", "Aggregate", "ListenHub"]
