"""The registry's state (gateway.registry.state): versions aggregated over the fleet, observed
versions bounded, without I/O.
"""

from __future__ import annotations

import pytest

from gateway.registry import (
    ProbeRecord,
    ProbeResult,
    RegistryState,
    UpstreamState,
)

from ..support.wire import LEGACY_VERSIONS, V
from .harness import (
    FUTURE_V,
    LEGACY_V,
)

pytestmark = pytest.mark.timeout(60)


# -- state and aggregation (pure) ----------------------------------------------------------------------


def up_state(name: str, era: str, advertised: tuple[str, ...], health: str = "up") -> ProbeResult:
    return ProbeResult(health=health, outcome=era, era=era, advertised=advertised, capabilities={})  # type: ignore[arg-type]


def test_aggregate_covers_only_up_upstreams_newest_first() -> None:
    state = RegistryState(["pub", "legacy", "scripted", "gone"])
    record = ProbeRecord(0, 1, "modern", None)
    state.upstreams["pub"].apply(up_state("pub", "modern", (V,)), record)
    state.upstreams["legacy"].apply(up_state("legacy", "legacy", (LEGACY_V,)), record)
    state.upstreams["scripted"].apply(up_state("scripted", "modern", (V, FUTURE_V, LEGACY_V)), record)
    state.upstreams["gone"].apply(up_state("gone", "modern", ("2024-11-05",)), record)
    state.upstreams["gone"].apply(ProbeResult(health="down", outcome="unreachable"), record)
    state.observe("pub", "2025-06-18")
    out = state.aggregate()
    assert out["union"] == [FUTURE_V, V, LEGACY_V, "2025-06-18"]
    assert out["intersection"] == []
    assert out["byVersion"] == {
        FUTURE_V: ["scripted"],
        V: ["pub", "scripted"],
        LEGACY_V: ["legacy", "scripted"],
        "2025-06-18": ["pub"],
    }
    assert out["upstreams"]["gone"] == {"advertised": ["2024-11-05"], "observed": [], "era": "modern", "up": False}
    assert out["upstreams"]["pub"]["observed"] == ["2025-06-18"]
    state.upstreams["legacy"].apply(ProbeResult(health="down", outcome="unreachable"), record)
    out = state.aggregate()
    assert (out["union"], out["intersection"]) == ([FUTURE_V, V, LEGACY_V, "2025-06-18"], [V])
    assert out["byVersion"][LEGACY_V] == ["scripted"]


def test_observed_versions_are_bounded_and_known_and_reset_when_an_upstream_comes_back() -> None:
    state = RegistryState(["a"])
    a: UpstreamState = state.upstreams["a"]
    a.advertised = tuple(f"2026-01-{i:02d}" for i in range(1, 17))
    for version in (*a.advertised, V, *LEGACY_VERSIONS):  # 21 versions it may be seen to speak
        state.observe("a", version)
    state.observe("a", "bad version\n")
    state.observe("a", "9999-12-31")  # well-formed, but neither known nor advertised
    state.observe("nope", V)
    observed = a.observed
    assert len(observed) == 16 and "bad version\n" not in observed and "9999-12-31" not in observed
    record = ProbeRecord(0, 1, "modern", None)
    a.apply(up_state("a", "modern", (V,)), record)  # unknown -> up keeps them
    assert len(a.observed) == 16
    a.apply(ProbeResult(health="down", outcome="unreachable"), record)
    assert len(a.observed) == 16  # still shown while down (but not aggregated)
    a.apply(up_state("a", "modern", (V,)), record)  # down -> up: maybe another build
    assert a.observed == {}
