"""``[aggregate]`` in the config: what is accepted, and what is an error naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config

UPSTREAMS = {"a": {"url": "http://127.0.0.1:9/mcp"}, "b": {"url": "http://127.0.0.1:10/mcp"}}


def config(**aggregate: Any) -> dict[str, Any]:
    return {"upstreams": UPSTREAMS, "aggregate": aggregate}


def test_the_defaults() -> None:
    cfg = parse_config(config(), env={})
    assert cfg.aggregate is not None
    assert (cfg.aggregate.separator, cfg.aggregate.page_size, cfg.aggregate.max_member_pages) == ("__", 100, 20)
    assert cfg.aggregate.max_listen_streams == 1024
    assert cfg.aggregate_members() == ("a", "b")  # every upstream, in config order


def test_without_the_section_there_is_no_aggregate() -> None:
    assert parse_config({"upstreams": UPSTREAMS}, env={}).aggregate is None


def test_members_in_the_order_given() -> None:
    assert parse_config(config(upstreams=["b", "a"]), env={}).aggregate_members() == ("b", "a")


@pytest.mark.parametrize(
    "aggregate",
    [
        {"upstreams": ["a", "nope"]},
        {"upstreams": ["a", "a"]},
        {"separator": ""},
        {"separator": "/"},
        {"separator": "a/b"},
        {"separator": "123456789"},
        {"separator": " "},
        {"page_size": 0},
        {"page_size": 10_001},
        {"max_member_pages": 0},
        {"max_member_pages": 1001},
        {"max_listen_streams": 0},
        {"unknown_key": 1},
    ],
    ids=repr,
)
def test_bad_values_are_config_errors_naming_the_key(aggregate: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config(**aggregate), env={})
    assert "aggregate" in str(raised.value)


@pytest.mark.parametrize("separator", [".", "::", "-", "12345678", "~"])
def test_good_separators(separator: str) -> None:
    cfg = parse_config(config(separator=separator), env={})
    assert cfg.aggregate is not None and cfg.aggregate.separator == separator


def test_an_unknown_member_is_named_with_the_closest_upstream() -> None:
    with pytest.raises(ConfigError, match=r"aggregate: upstreams: no upstream named 'aa' \(did you mean 'a'\?"):
        parse_config(config(upstreams=["aa"]), env={})


def test_a_member_listed_twice_is_named() -> None:
    with pytest.raises(ConfigError, match=r"aggregate: upstreams: 'b' is listed twice"):
        parse_config(config(upstreams=["a", "b", "b"]), env={})


def test_an_empty_member_list_is_an_error_not_an_empty_server() -> None:
    with pytest.raises(ConfigError, match=r"aggregate: upstreams: names no member"):
        parse_config(config(upstreams=[]), env={})
    with pytest.raises(ConfigError, match=r"aggregate: there are no upstreams to aggregate"):
        parse_config({"aggregate": {}}, env={})


@pytest.mark.parametrize(
    ("members", "separator"), [(("pub", "pub_slow"), "_"), (("a", "a__b"), "__"), (("a", "a_"), "__")]
)
def test_a_separator_that_makes_exposed_names_ambiguous_is_an_error(members: tuple[str, str], separator: str) -> None:
    # With members pub and pub_slow and "_", pub_slow_x is pub's tool slow_x or pub_slow's tool x.
    upstreams = {name: {"url": f"http://127.0.0.1:{9 + i}/mcp"} for i, name in enumerate(members)}
    with pytest.raises(ConfigError, match=r"aggregate: separator: members .* ambiguous"):
        parse_config({"upstreams": upstreams, "aggregate": {"separator": separator}}, env={})
    other = "." if separator != "." else "::"
    assert parse_config({"upstreams": upstreams, "aggregate": {"separator": other}}, env={}).aggregate is not None
