"""Lists filtered per caller from the one shared entry (gateway/policy/views.py)."""

from __future__ import annotations

import gc
from typing import Any

import orjson

from gateway.auth import Caller
from gateway.cache import build_entry
from gateway.codec import id_json
from gateway.config import PolicyConfig
from gateway.policy import ListViews, Policy

TOOLS = [
    {"name": "get_forecast", "description": "é", "inputSchema": {"type": "object", "properties": {"b": {}, "a": {}}}},
    {"name": "set_alarm", "inputSchema": {"type": "object"}},
    {"name": "get_history", "annotations": {"readOnlyHint": True}, "inputSchema": {"type": "object"}},
    {"title": "no name"},
]


def entry(**result: Any) -> Any:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"resultType": "complete", "cacheScope": "public", "ttlMs": 60000, **result},
    }
    made = build_entry(message, 100.0, 3_600_000)
    assert made is not None
    return made


def rights(*tools: str, resources: tuple[str, ...] = ()) -> Any:
    config = PolicyConfig.model_validate({"rules": [{"name": "r", "tools": list(tools), "resources": list(resources)}]})
    return Policy(config).rights(Caller("token"))


def answer(made: Any, now: float) -> dict[str, Any]:
    parsed: dict[str, Any] = orjson.loads(made.response(id_json(5), now))
    return parsed


def test_a_view_keeps_the_allowed_items_unchanged_the_cursor_and_the_time_left_and_says_private() -> None:
    shared = entry(tools=TOOLS, nextCursor="page-2")
    view = ListViews().view(shared, "tools/list", "weather", rights("get_*"))
    got, plain = answer(view, 130.5), answer(shared, 130.5)
    assert got["id"] == 5 and got["result"]["tools"] == [TOOLS[0], TOOLS[2]]
    assert got["result"]["nextCursor"] == "page-2"
    assert got["result"]["ttlMs"] == plain["result"]["ttlMs"] == 29500
    assert (got["result"]["cacheScope"], plain["result"]["cacheScope"]) == ("private", "public")
    # The same JSON value, down to the order of each item's members.
    assert [orjson.dumps(t) for t in got["result"]["tools"]] == [orjson.dumps(TOOLS[0]), orjson.dumps(TOOLS[2])]
    assert view.expires_at == shared.expires_at and view.refresh_at == shared.refresh_at


def test_a_view_is_computed_once_per_entry_and_rights_and_goes_with_its_entry() -> None:
    views = ListViews()
    shared = entry(tools=TOOLS)
    rules = [
        {"name": "read", "scopes": ["r"], "tools": ["get_*"]},
        {"name": "write", "scopes": ["w"], "tools": ["set_*"]},
    ]
    engine = Policy(PolicyConfig.model_validate({"rules": rules}))
    reader = engine.rights(Caller("static", scopes=frozenset({"r"})))
    writer = engine.rights(Caller("static", scopes=frozenset({"w"})))
    first = views.view(shared, "tools/list", "weather", reader)
    assert views.view(shared, "tools/list", "weather", reader) is first
    other = views.view(shared, "tools/list", "weather", writer)
    assert other is not first and views.view(shared, "tools/list", "weather", writer) is other
    assert [t["name"] for t in answer(other, 101)["result"]["tools"]] == ["set_alarm"]
    assert len(views) == 2
    del shared, first, other
    gc.collect()
    assert len(views) == 0


def test_resources_and_templates_are_filtered_by_uri_and_other_methods_pass_unchanged() -> None:
    views = ListViews()
    allowed = rights(resources=("notes://public/*",))
    listed = entry(resources=[{"uri": "notes://public/a", "name": "a"}, {"uri": "notes://private/b", "name": "b"}])
    assert [
        r["uri"] for r in answer(views.view(listed, "resources/list", "n", allowed), 101)["result"]["resources"]
    ] == ["notes://public/a"]
    templates = entry(
        resourceTemplates=[{"uriTemplate": "notes://public/{id}", "name": "t"}, {"uriTemplate": "x://{id}"}]
    )
    got = answer(views.view(templates, "resources/templates/list", "n", allowed), 101)["result"]
    assert got["resourceTemplates"] == [{"uriTemplate": "notes://public/{id}", "name": "t"}]
    read = entry(contents=[{"uri": "notes://public/a", "text": "x"}])
    assert views.view(read, "resources/read", "n", allowed) is read
