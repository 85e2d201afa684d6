"""Invalidations Redis has not taken (gateway/cluster/outbox.py): kept, fenced and bounded."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.cache import Invalidation
from gateway.cluster.feed import Feed
from gateway.cluster.generations import Generations
from gateway.cluster.link import RedisLink
from gateway.cluster.mac import Keys
from gateway.cluster.outbox import MAX_PENDING, Outbox
from gateway.config import ClusterConfig
from gateway.telemetry import GatewayMetrics

#: Two upstreams (name -> identity) and the methods of theirs this test invalidates.
IDENTITIES = {"a": "0a", "b": "0b"}
METHODS = ["prompts/list", "tools/list"]


def scope(invalidation: Invalidation) -> tuple[list[str], list[str]]:
    upstreams = list(IDENTITIES) if invalidation.upstream is None else [invalidation.upstream]
    return upstreams, list(METHODS) if invalidation.methods is None else list(invalidation.methods)


async def test_invalidations_kept_while_redis_is_away_are_fenced_counted_and_merged_past_the_bound() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, cluster=True)
    # Never connected (down): nothing is tried, everything is kept.
    link = RedisLink(ClusterConfig(redis_url="redis://127.0.0.1:9/0", key_prefix="t"), metrics)
    feed = Feed(
        link.config, link, keys=Keys(None), on_event=lambda _e: None, on_up=lambda: None, on_lost=lambda _r: None
    )
    generations = Generations(link, IDENTITIES, METHODS)
    outbox = Outbox(link, generations, feed, metrics, origin="me", scope=scope, delivered=lambda _p: None)
    try:
        assert not await outbox.send(Invalidation("a", ("tools/list",)), "purge", ["a"], ["tools/list"])
        assert outbox.fenced == {generations.field("a", "tools/list")}
        assert registry.get_sample_value("mcp_gateway_cluster_invalidations_pending") == 1
        for _ in range(MAX_PENDING):
            assert not await outbox.send(Invalidation("b", ("tools/list",)), "notification", ["b"], ["tools/list"])
        assert len(outbox) == 1  # one invalidation of everything, in place of all of them
        merged = outbox.pending[0]
        assert merged.invalidation == Invalidation() and merged.reason == "purge"
        assert outbox.fenced == {generations.field(u, m) for u in IDENTITIES for m in METHODS}
        assert registry.get_sample_value("mcp_gateway_cluster_invalidations_pending") == 1
    finally:
        await feed.close()
        await link.close()
