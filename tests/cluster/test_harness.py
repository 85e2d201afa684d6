"""The cluster tests' own tools: the real ``redis-server`` and the gateway replicas behave as
their tests assume (tests/support/redis.py, tests/support/replicas.py)."""

from __future__ import annotations

import gzip
import time
import tomllib
import zlib
from pathlib import Path

import aiohttp
import pytest
import redis

from ..support.redis import RedisServer, plain_forms
from ..support.replicas import ADMIN_TOKEN, dump_toml
from .conftest import StartReplicas

pytestmark = pytest.mark.timeout(60)


def test_redis_server_restarts_empty_on_the_same_port_and_pauses_its_clients(redis_server: RedisServer) -> None:
    url, port = redis_server.url, redis_server.port
    assert url == f"redis://127.0.0.1:{port}/0"
    with redis_server.client() as client:
        client.set(b"k", b"v", px=60_000)
        client.hset(b"h", mapping={b"f": b"x"})
    assert redis_server.scan_keys() == [b"h", b"k"]
    assert redis_server.dump_all() == {b"k": b"v", b"h": {b"f": b"x"}}
    assert redis_server.command("CONFIG", "GET", "save") == {b"save": b""}
    assert redis_server.command("CONFIG", "GET", "appendonly") == {b"appendonly": b"no"}

    redis_server.stop()
    assert not redis_server.running
    with pytest.raises(redis.ConnectionError), redis_server.client(timeout=0.2) as client:
        client.ping()
    redis_server.start()
    assert redis_server.port == port and redis_server.url == url
    assert redis_server.scan_keys() == []  # nothing persisted

    redis_server.pause(0.4)
    started = time.monotonic()
    with redis_server.client() as client:
        client.ping()
    assert time.monotonic() - started >= 0.3

    redis_server.kill()
    assert not redis_server.running
    assert "start 2" in redis_server.log()


def test_a_filled_redis_refuses_every_write_and_serves_reads_until_it_has_room(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        client.set(b"k", b"v")
        client.xadd(b"s", {b"e": b"1"})
    assert redis_server.fill() > 0
    with redis_server.client() as client:
        assert client.get(b"k") == b"v" and len(client.xrange(b"s")) == 1  # reads are served
        for write in (
            lambda: client.set(b"k", b"w", px=1000),
            lambda: client.xadd(b"s", {b"e": b"2"}),
            lambda: client.hincrby(b"h", b"f", 1),
            lambda: client.eval("return redis.call('SET', KEYS[1], 'x')", 1, b"k"),
        ):
            with pytest.raises(redis.ResponseError):
                write()
    redis_server.make_room()
    with redis_server.client() as client:
        assert client.set(b"k", b"w")
        assert redis_server.scan_keys("test-filler:*") == []


def test_garbage_keeps_each_keys_type_and_expiry(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        client.set(b"p:s", b'{"ok": true}', px=30_000)
        client.hset(b"p:h", mapping={b"a": b"1", b"b": b"2"})
        client.rpush(b"p:l", b"x", b"y")
        client.set(b"other", b"untouched")
        assert redis_server.write_garbage_over_every_key("p:*") == 3
        assert client.get(b"p:s") != b'{"ok": true}'
        assert 0 < client.pttl(b"p:s") <= 30_000
        assert client.type(b"p:h") == b"hash" and set(client.hgetall(b"p:h").values()).isdisjoint({b"1", b"2"})
        assert client.llen(b"p:l") == 2 and b"x" not in client.lrange(b"p:l", 0, -1)
        assert client.get(b"other") == b"untouched"


def test_plain_forms_inflate_compressed_values() -> None:
    assert any(b"needle" in f for f in plain_forms(zlib.compress(b"a needle")))
    assert any(b"needle" in f for f in plain_forms(gzip.compress(b"a needle")))
    assert plain_forms(b"plain") == [b"plain"]


def test_dump_toml_writes_what_tomllib_reads_back(tmp_path: Path) -> None:
    data = {
        "listener": {"port": 0, "host": "127.0.0.1"},
        "cluster": {"redis_url": "redis://127.0.0.1:1/0", "key_prefix": "a.b-c", "timeout_s": 0.25},
        "auth": {"tokens": ["t" * 16, 'quote " and \\ and \x7f and é']},
        "upstreams": {"a.b": {"url": "http://x/mcp", "headers": {"X-K": "v"}}, "plain": {"url": "http://y/mcp"}},
        "registry": {"enabled": False},
    }
    assert tomllib.loads(dump_toml(data)) == data


async def test_replicas_answer_healthz_on_their_own_ports_and_restart_there_after_sigkill(
    start_replicas: StartReplicas, tmp_path: Path
) -> None:
    config = {"registry": {"enabled": False}, "upstreams": {"up": {"url": "http://127.0.0.1:9/mcp"}}}
    replicas = await start_replicas(config, 2)
    assert len({r.port for r in replicas.replicas}) == 2
    assert replicas.admin_token == ADMIN_TOKEN
    assert 'token = "' + ADMIN_TOKEN + '"' in replicas[0].config_path.read_text()
    port = replicas[1].port
    replicas.sigkill(1)
    assert replicas.indices() == [0]
    await replicas.start(1)
    assert replicas[1].port == port and replicas.indices() == [0, 1]
    async with aiohttp.ClientSession() as http:
        for i in replicas.indices():
            async with http.get(f"{replicas.base_url(i)}/healthz") as resp:
                assert resp.status == 200
        url = f"{replicas.base_url(0)}/admin/cache/purge"
        async with http.post(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp:
            assert resp.status == 200 and (await resp.json()) == {"purged": 0}
    assert await replicas.stop(0) == 0
    assert replicas.indices() == [1]
    assert "start 2" in replicas.log(1) and "Running on" in replicas.log(0)
