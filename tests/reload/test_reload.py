"""Config reload without a restart (gateway.reload): what a reload keeps, drops and adds, that an
invalid file changes nothing, and that requests in flight finish on the config they began with.

The diff and a gateway that cannot reload are tested in-process; the rest against real ``mcp-gateway serve`` processes
(tests/support/replicas.py, one replica) in front of real SDK upstreams (tests/servers/), reloaded
with ``SIGHUP`` (``os.kill``) or ``POST /admin/reload``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import ConfigError, parse_config
from gateway.reload import ConfigDiff, applicable, diff_configs

from ..support.fleet import REPO_ROOT, Upstream, fetch_counts, fetch_requests, free_port
from ..support.polling import wait_until
from ..support.reloading import (
    admin_reload,
    begun,
    gateway,
    public,
    rewrite,
    served_sha,
    sighup,
    steady_load,
    tools_list,
)
from ..support.wire import mcp_headers, rpc, sse_events

# -- the diff, in-process ----------------------------------------------------------------------------


def config_of(**upstreams: Mapping[str, Any]) -> Any:
    return parse_config(
        {"upstreams": {name: {"url": "http://127.0.0.1:1/mcp", **up} for name, up in upstreams.items()}}
    )


def test_the_diff_sorts_upstreams_into_added_removed_changed_and_retuned() -> None:
    before = config_of(a={}, b={}, c={}, d={"timeout_s": 5})
    after = config_of(a={}, c={"headers": {"X-Tag": "2"}}, d={"timeout_s": 9}, e={})
    assert diff_configs(before, after) == ConfigDiff(added=("e",), removed=("b",), changed=("c",), retuned=("d",))


@pytest.mark.parametrize(
    "change",
    [
        {"url": "http://127.0.0.1:2/mcp"},
        {"headers": {"Authorization": "Bearer other"}},
        {"forward_authorization": True},
        {"vary_on_client_capabilities": False},
    ],
)
def test_an_answer_changing_setting_makes_the_upstream_changed(change: dict[str, Any]) -> None:
    diff = diff_configs(config_of(a={}), config_of(a=change))
    assert (diff.changed, diff.retuned, diff.dropped, diff.fresh) == (("a",), (), ("a",), ("a",))


def test_the_cache_default_for_capabilities_changes_the_upstreams_that_follow_it() -> None:
    before = parse_config({"upstreams": {"a": {"url": "http://127.0.0.1:1/mcp"}}})
    after = parse_config(
        {"cache": {"vary_on_client_capabilities": False}, "upstreams": {"a": {"url": "http://127.0.0.1:1/mcp"}}}
    )
    assert diff_configs(before, after).changed == ("a",)


def test_the_diff_names_the_keys_that_need_a_restart() -> None:
    up = {"a": {"url": "http://127.0.0.1:1/mcp"}}
    before = parse_config({"listener": {"port": 8080}, "upstreams": up})
    after = parse_config(
        {
            "listener": {"port": 8081, "max_body_bytes": 1000},
            "cluster": {"redis_url": "redis://127.0.0.1:6379/0"},
            "admin": {"token": "t" * 16},
            "upstreams": up,
        }
    )
    assert diff_configs(before, after).not_applied == ("listener.port", "listener.max_body_bytes", "cluster", "admin")


def test_the_applied_config_keeps_the_running_listener_and_takes_the_rest_from_the_file() -> None:
    running = parse_config({"listener": {"port": 8080}, "upstreams": {"a": {"url": "http://127.0.0.1:1/mcp"}}})
    new = parse_config({"listener": {"port": 9090}, "upstreams": {"b": {"url": "http://127.0.0.1:2/mcp"}}})
    applied = applicable(running, new)
    assert (applied.listener.port, list(applied.upstreams)) == (8080, ["b"])
    assert applicable(running, running) is running


def test_a_kept_table_that_no_longer_fits_the_file_refuses_the_reload_naming_it() -> None:
    running = parse_config(
        {
            "aggregate": {"upstreams": ["a", "b"]},
            "upstreams": {"a": {"url": "http://127.0.0.1:1/mcp"}, "b": {"url": "http://127.0.0.1:2/mcp"}},
        }
    )
    new = parse_config({"upstreams": {"a": {"url": "http://127.0.0.1:1/mcp"}}})  # [aggregate] gone, and b
    with pytest.raises(ConfigError, match=r"without a restart, with the running \[aggregate\]: aggregate"):
        applicable(running, new)


def test_an_unchanged_config_changes_nothing() -> None:
    assert diff_configs(config_of(a={}, b={}), config_of(a={}, b={})) == ConfigDiff()


# -- real processes ----------------------------------------------------------------------------------


async def test_an_upstream_added_to_the_file_is_served_within_2_s_of_sighup_and_no_other_request_fails(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    async with gateway(tmp_path, {"upstreams": {"a": public(up_a)}}) as gw:
        assert (await tools_list(http, gw.url(0, "b"))).status == 404
        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(http, [gw.url(0, "a")], stop))
        await wait_until(lambda: fetch_counts(up_a), what="the load to start")
        sha = rewrite(gw, {"upstreams": {"a": public(up_a), "b": public(up_b)}})
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert gw[0].process is not None
        os.kill(gw[0].process.pid, signal.SIGHUP)

        async def b_served() -> bool:
            reply = await tools_list(http, gw.url(0, "b"))
            return reply.status == 200 and "result" in reply.json

        await wait_until(b_served, limit_s=2, what="upstream b to be served")
        took = loop.time() - started
        probed = (await fetch_counts(up_b)).get("server/discover", 0)
        stop.set()
        sent, failures = await load
        assert await served_sha(gw) == sha
        assert await gw.metric(0, "mcp_gateway_config_info", sha256=sha) == 1
        assert [k for k in await gw.metrics(0) if k[0] == "mcp_gateway_config_info"] == [
            ("mcp_gateway_config_info", (("sha256", sha),))
        ]
    assert failures == [], failures[:5]
    assert sent > 0 and took < 2.0
    assert probed >= 1  # probed at once, not at the next probe interval


async def test_a_removed_upstream_answers_unknown_upstream_and_loses_its_entries_while_the_others_still_hit(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    both = {"upstreams": {"a": public(up_a), "b": public(up_b)}}
    async with gateway(tmp_path, both) as gw:
        for name in ("a", "b"):
            await tools_list(http, gw.url(0, name))
            assert (await tools_list(http, gw.url(0, name))).cache_hit
        await sighup(gw, rewrite(gw, {"upstreams": {"a": public(up_a)}}))
        gone = await tools_list(http, gw.url(0, "b"), 7)
        assert gone.status == 404 and gone.json["error"]["code"] == -32601 and gone.json["id"] == 7
        assert (await tools_list(http, gw.url(0, "a"))).cache_hit
        assert await gw.metric(0, "mcp_gateway_cache_evictions_total", reason="reload") == 1
        await sighup(gw, rewrite(gw, both))  # back: its old entry is not
        again = await tools_list(http, gw.url(0, "b"))
        assert again.status == 200 and not again.cache_hit
        assert (await fetch_counts(up_b))["tools/list"] == 2
        assert (await fetch_counts(up_a))["tools/list"] == 1


async def test_a_changed_header_makes_the_next_request_a_miss_that_carries_the_new_header(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    tagged = {"upstreams": {"a": public(up_a, headers={"X-Fleet-Tag": "one"}), "b": public(up_b, timeout_s=30)}}
    async with gateway(tmp_path, tagged) as gw:
        for name in ("a", "b"):
            await tools_list(http, gw.url(0, name))
        retagged = {"upstreams": {"a": public(up_a, headers={"X-Fleet-Tag": "two"}), "b": public(up_b, timeout_s=9)}}
        sha = rewrite(gw, retagged)
        async with http.post(f"{gw.base_url(0)}/admin/reload") as resp:  # no admin token
            assert resp.status == 401
        assert await served_sha(gw) != sha
        status, body = await admin_reload(http, gw)
        assert (status, body["config_sha256"], body["changed"], body["retuned"]) == (200, sha, ["a"], ["b"])
        after = await tools_list(http, gw.url(0, "a"))
        assert after.status == 200 and not after.cache_hit
        assert (await tools_list(http, gw.url(0, "b"))).cache_hit  # retuned: its entry kept
    lists = [r for r in await fetch_requests(up_a) if r.json().get("method") == "tools/list"]
    assert [r.header("X-Fleet-Tag") for r in lists] == ["one", "two"]


async def test_a_request_begun_before_a_header_change_stores_nothing_the_new_config_reads(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, _ = counted
    async with gateway(tmp_path, {"upstreams": {"a": public(up_a, headers={"X-Fleet-Tag": "one"})}}) as gw:
        async with begun(gw[0].port, "/servers/a/mcp", rpc("tools/list", "old")) as finish:
            rewrite(gw, {"upstreams": {"a": public(up_a, headers={"X-Fleet-Tag": "two"})}})
            assert (await admin_reload(http, gw))[1]["changed"] == ["a"]
            answer = await finish()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        after = await tools_list(http, gw.url(0, "a"))  # its answer, fetched the old way, was not kept
        assert after.status == 200 and not after.cache_hit
        assert (await tools_list(http, gw.url(0, "a"))).cache_hit
    lists = [r for r in await fetch_requests(up_a) if r.json().get("method") == "tools/list"]
    assert [r.header("X-Fleet-Tag") for r in lists] == ["one", "two"]


async def test_a_secret_file_is_read_again_at_each_reload(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, _ = counted
    secret = tmp_path / "secret"
    secret.write_text("first-secret\n")
    config = {"upstreams": {"a": public(up_a, headers={"X-Fleet-Tag": f"${{file:{secret}}}"})}}
    async with gateway(tmp_path, config) as gw:
        await tools_list(http, gw.url(0, "a"))
        secret.write_text("second-secret\n")  # the config file itself is unchanged
        status, body = await admin_reload(http, gw)
        assert (status, body["changed"]) == (200, ["a"])
        assert not (await tools_list(http, gw.url(0, "a"))).cache_hit
    lists = [r for r in await fetch_requests(up_a) if r.json().get("method") == "tools/list"]
    assert [r.header("X-Fleet-Tag") for r in lists] == ["first-secret", "second-secret"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[cache]\nmax_ttl_msec = 5\n[upstreams.a]\nurl = "URL"\n', "cache.max_ttl_msec: unknown key"),
        ('[upstreams.a]\nurl = "URL"\ntimeout_s = "soon"\n', "upstreams.a.timeout_s"),
        ("[upstreams.a\n", "invalid TOML"),
    ],
)
async def test_an_invalid_file_is_refused_with_check_configs_message_and_the_old_config_still_serves(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream], text: str, named: str
) -> None:
    up_a, _ = counted
    async with gateway(tmp_path, {"upstreams": {"a": public(up_a)}}) as gw:
        await tools_list(http, gw.url(0, "a"))
        serving = await served_sha(gw)
        path = gw[0].config_path
        path.write_text(text.replace("URL", up_a.url))
        status, body = await admin_reload(http, gw)
        check = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "check-config", str(path),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO_ROOT,
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(check.communicate(), 60)
        assert (status, body["reloaded"], body["config_sha256"]) == (400, False, serving)
        assert named in body["error"]
        assert check.returncode == 2 and stderr.decode().strip() == f"mcp-gateway: {body['error']}"
        assert (await tools_list(http, gw.url(0, "a"))).cache_hit
        assert await served_sha(gw) == serving
        assert await gw.metric(0, "mcp_gateway_config_reloads_total", outcome="failed") == 1
        assert await gw.metric(0, "mcp_gateway_config_info", sha256=str(serving)) == 1
        assert "config reload failed" in gw.log(0)


async def test_the_aggregate_endpoint_serves_the_members_of_the_reloaded_config(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    async with gateway(tmp_path, {"aggregate": {}, "upstreams": {"a": public(up_a)}}) as gw:
        url = f"{gw.base_url(0)}/mcp"

        async def tool_names() -> list[str]:
            reply = await tools_list(http, url)
            assert reply.status == 200, reply.raw
            return sorted(tool["name"] for tool in reply.result["tools"])

        assert {name.split("__")[0] for name in await tool_names()} == {"a"}
        assert await tool_names() == await tool_names()  # composed and stored: a hit now
        rewrite(gw, {"aggregate": {}, "upstreams": {"a": public(up_a), "b": public(up_b)}})
        assert (await admin_reload(http, gw))[0] == 200
        assert {name.split("__")[0] for name in await tool_names()} == {"a", "b"}  # not the stored one
        rewrite(gw, {"aggregate": {"separator": "--"}, "upstreams": {"b": public(up_b)}})
        assert (await admin_reload(http, gw))[0] == 200
        assert {name.split("--")[0] for name in await tool_names()} == {"b"}


async def test_a_smaller_max_entries_evicts_down_to_it_at_the_reload(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    config: dict[str, Any] = {"upstreams": {"a": public(up_a), "b": public(up_b)}}
    async with gateway(tmp_path, config) as gw:
        for name in ("a", "b"):
            await tools_list(http, gw.url(0, name))
        assert await gw.metric(0, "mcp_gateway_cache_entries") == 2
        rewrite(gw, {**config, "cache": {"max_entries": 1}})
        status, body = await admin_reload(http, gw)
        assert (status, body["retuned"], body["changed"]) == (200, [], [])
        assert await gw.metric(0, "mcp_gateway_cache_entries") == 1
        assert (await tools_list(http, gw.url(0, "b"))).cache_hit  # the most recently used one stays


async def test_new_auth_tokens_apply_from_the_next_request(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, _ = counted
    config: dict[str, Any] = {"upstreams": {"a": public(up_a)}}
    async with gateway(tmp_path, config) as gw:
        assert (await tools_list(http, gw.url(0, "a"))).status == 200
        token = "reloaded-caller-token-0123456789"
        rewrite(gw, {**config, "auth": {"tokens": [token]}})
        assert (await admin_reload(http, gw))[0] == 200
        assert (await tools_list(http, gw.url(0, "a"))).status == 401
        with_token = await tools_list(http, gw.url(0, "a"), headers={"Authorization": f"Bearer {token}"})
        assert with_token.status == 200 and with_token.cache_hit


async def test_a_stream_in_flight_finishes_across_a_reload_that_removes_its_upstream(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    async with gateway(tmp_path, {"upstreams": {"a": public(up_a), "b": public(up_b)}}) as gw:
        params = {"name": "slow_progress", "arguments": {"steps": 10, "delay_ms": 150}}
        body = json.dumps(rpc("tools/call", 5, meta={"progressToken": "p"}, **params)).encode()
        headers = mcp_headers("tools/call", "slow_progress")
        raw = b""
        async with http.post(gw.url(0, "a"), data=body, headers=headers) as resp:
            assert resp.content_type == "text/event-stream"
            reloaded = None
            async for chunk in resp.content.iter_any():
                raw += chunk
                if reloaded is None and sse_events(raw, at_eof=False):
                    rewrite(gw, {"upstreams": {"b": public(up_b)}})
                    reloaded = await admin_reload(http, gw)
                    assert reloaded[0] == 200 and reloaded[1]["removed"] == ["a"]
        messages = [json.loads(event) for event in sse_events(raw)]
        assert reloaded is not None
        assert messages[-1]["id"] == 5 and messages[-1]["result"]["structuredContent"] == {
            "result": "done after 10 steps"
        }
        assert len([m for m in messages if m.get("method") == "notifications/progress"]) == 10
        assert (await tools_list(http, gw.url(0, "a"))).status == 404


async def test_a_listener_change_is_named_as_not_applied_and_the_rest_applies(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    async with gateway(tmp_path, {"upstreams": {"a": public(up_a)}}) as gw:
        moved = {"listener": {"port": free_port(), "max_body_bytes": 100_000}, "upstreams": {"a": public(up_a)}}
        moved["upstreams"]["b"] = public(up_b)
        rewrite(gw, moved)
        status, body = await admin_reload(http, gw)
        assert (status, body["not_applied"], body["added"]) == (
            200,
            ["listener.port", "listener.max_body_bytes"],
            ["b"],
        )
        assert "listener.port" in body["detail"] and "restart" in body["detail"]
        assert (await tools_list(http, gw.url(0, "b"))).status == 200  # on the port it listens on
        assert "not applied, a restart needed: listener.port, listener.max_body_bytes" in gw.log(0)


def test_a_reload_names_the_other_tables_it_changes() -> None:
    up = {"a": {"url": "http://127.0.0.1:1/mcp"}}
    rules = {"rules": [{"name": "r", "tools": ["get_*"]}]}
    before = parse_config({"upstreams": up})
    after = parse_config({"auth": {"tokens": ["t" * 16]}, "policy": rules, "upstreams": up})
    assert diff_configs(before, after).tables == ("auth", "policy")
    assert diff_configs(after, after).tables == ()
