"""``mcp-gateway serve --watch`` (gateway.watch): a change to the config file, or to a
``${file:PATH}`` secret it reads, reloads it without a signal; so does a Kubernetes ConfigMap
update, which writes a new directory and renames a ``..data`` symlink over the old one.

Real ``mcp-gateway serve`` processes (tests/support/replicas.py; one process, or ``--workers 2``
where the parent watches) in front of real SDK upstreams, the registry off.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import aiohttp
import pytest

from ..support.fleet import Upstream
from ..support.polling import wait_until
from ..support.reloading import public, rewrite, served_sha, tools_list
from ..support.replicas import Replicas, dump_toml
from .test_relay import RELOADED_WITHIN_S, group, reloads, served_by_both_workers

pytestmark = pytest.mark.timeout(120)

#: How soon a change on disk is served: the debounce (0.5 s) and a reload (milliseconds).
WATCHED_WITHIN_S = RELOADED_WITHIN_S


async def test_with_workers_an_edited_file_is_served_by_both_within_two_seconds_without_a_signal(
    tmp_path: Path, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    async with group(tmp_path, {"upstreams": {"a": public(up_a)}}, "--watch") as gw:
        rewrite(gw, {"registry": {"enabled": False}, "upstreams": {"a": public(up_a), "b": public(up_b)}})
        await served_by_both_workers(gw, "b", up_b, limit_s=WATCHED_WITHIN_S)
        assert reloads(await gw.metrics(0), "ok") == 2


async def test_a_changed_secret_file_reloads_though_the_config_file_is_the_same(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, _ = counted
    secret = tmp_path / "admin-token"
    secret.write_text("first-admin-token-0123456789\n")
    config = {"registry": {"enabled": False}, "upstreams": {"a": public(up_a)}}
    gw = Replicas({**config, "admin": {"token": f"${{file:{secret}}}"}}, 1, tmp_path, extra_args=("--watch",))
    try:
        await gw.start_all()
        sha = await served_sha(gw)

        async def new_token_taken() -> bool:
            headers = {"Authorization": "Bearer second-admin-token-0123456789"}
            async with http.post(f"{gw.base_url(0)}/admin/cache/purge?upstream=a", headers=headers) as resp:
                assert resp.status in (200, 401)
                return resp.status == 200

        assert not await new_token_taken()
        secret.write_text("second-admin-token-0123456789\n")
        await wait_until(new_token_taken, limit_s=WATCHED_WITHIN_S, what="the new admin token to be taken")
        assert await served_sha(gw) == sha  # the file's bytes did not change
        assert reloads(await gw.metrics(0), "ok") == 1
    finally:
        await gw.close()


async def test_a_configmap_update_swapping_the_data_symlink_is_reloaded(
    tmp_path: Path, http: aiohttp.ClientSession, counted: tuple[Upstream, Upstream]
) -> None:
    up_a, up_b = counted
    mount = tmp_path / "config"
    gw = Replicas({"registry": {"enabled": False}, "upstreams": {"a": public(up_a)}}, 1, mount, extra_args=("--watch",))
    # What the kubelet mounts: config/gw.toml -> ..data/gw.toml, ..data -> ..v1 (a directory).
    path = gw[0].config_path
    first = path.read_text()
    (mount / "..v1").mkdir()
    (mount / "..v1" / path.name).write_text(first)
    (mount / "..data").symlink_to("..v1")
    path.unlink()
    path.symlink_to(Path("..data") / path.name)
    try:
        await gw.start_all()
        assert (await tools_list(http, gw.url(0, "b"))).status == 404
        # An update: a new directory, a new symlink renamed over ..data, the old directory removed.
        second = tomllib.loads(first)
        second["upstreams"]["b"] = public(up_b)
        (mount / "..v2").mkdir()
        (mount / "..v2" / path.name).write_text(dump_toml(second))
        (mount / "..data_tmp").symlink_to("..v2")
        os.rename(mount / "..data_tmp", mount / "..data")
        (mount / "..v1" / path.name).unlink()
        (mount / "..v1").rmdir()

        async def b_served() -> bool:
            return (await tools_list(http, gw.url(0, "b"))).status == 200

        await wait_until(b_served, limit_s=WATCHED_WITHIN_S, what="the ConfigMap update to be served")
        assert reloads(await gw.metrics(0), "ok") == 1
    finally:
        await gw.close()
