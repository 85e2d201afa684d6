"""Many replicas, one gateway: the shared tier on Redis (``[cluster]``).

Modules, lower first: ``link`` (the Redis client, a bound on every call, and the shared tier's
state: up, down or read-only, with the heartbeat that tells), ``mac`` (the cluster secret: the
MAC on every value, the digest naming an upstream's configuration), ``entries`` (shared entries:
names and checked values), ``feed`` (the event stream every process reads), ``generations`` (the
numbers invalidation raises), ``uris`` (the bounded index of cached resource URIs), ``outbox``
(invalidations Redis has not taken yet), ``waiters`` (callers waiting for another process's
leader), ``flight`` (a lookup's outcome and the cold key's lock), ``node`` (the shared tier,
single flight and invalidation for one process), ``lease`` (one holder per upstream for the
registry's probes and listen stream). Without ``[cluster]`` none of this runs. Apart from Redis,
``workers`` carries invalidation between the workers of one ``--workers`` group, and
``invalidator`` sends this process's invalidations to both (or to its store alone).
"""

from .invalidator import Invalidator
from .link import RedisLink, Unavailable
from .node import Cluster, Flight, Lookup, Spread

__all__ = ["Cluster", "Flight", "Invalidator", "Lookup", "RedisLink", "Spread", "Unavailable"]
