"""Many replicas, one gateway: the shared tier on Redis (``[cluster]``).

Modules, lower first: ``link`` (the Redis client, a bound on every call, up or down),
``entries`` (shared entries: names and checked values), ``feed`` (the event stream every process
reads), ``node`` (the shared tier, single flight and invalidation for one process), ``lease``
(one holder per upstream for the registry's probes and listen stream). Without ``[cluster]``
none of this runs.
"""

from .link import RedisLink, Unavailable
from .node import Cluster, Flight, Lookup

__all__ = ["Cluster", "Flight", "Lookup", "RedisLink", "Unavailable"]
