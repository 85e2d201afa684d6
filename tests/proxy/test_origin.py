"""DNS-rebinding protection (gateway.proxy.origin): which ``Origin`` and ``Host`` values pass.

The rules (MCP 2026-07-28, basic/transports/streamable-http, 'Security & Endpoint') are tested
on :class:`OriginPolicy` alone, then through a real gateway on a port chosen at run time, on
the hot path and the plain one, in front of a scripted upstream that counts what reaches it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.config import parse_config
from gateway.proxy.origin import MAX_REMEMBERED_HOSTS, OriginPolicy, is_loopback_address, is_loopback_host

from ..support import FakeUpstream, StartUpstream, mcp_headers, rpc

LOOPBACK = ("127.0.0.1", 8080)

# -- the rules, without a socket ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("LocalHost", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.2", False),
        ("gateway.example", False),
    ],
)
def test_loopback_bind_addresses_are_recognised(host: str, loopback: bool) -> None:
    assert is_loopback_address(host) is loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("[::1]", True),
        ("localhost:8080", True),
        ("127.0.0.1:1", True),
        ("[::1]:65535", True),
        ("LOCALHOST:8080", True),
        ("evil.example", False),
        ("evil.example:8080", False),
        ("localhost.evil.example", False),
        ("localhost:", False),
        ("localhost:65536", False),
        ("localhost:80a", False),
        ("localhost:\uff18\uff10", False),  # fullwidth digits
        ("::1", False),
        ("127.0.0.2", False),
        ("", False),
    ],
)
def test_loopback_host_values_are_the_three_names_with_or_without_a_port(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_own_origins_are_the_sockets_address_and_port_and_on_loopback_the_three_names() -> None:
    policy = OriginPolicy("127.0.0.1", (), None)
    assert policy.own_origins(("127.0.0.1", 41234)) == {
        "http://127.0.0.1:41234",
        "http://localhost:41234",
        "http://[::1]:41234",
    }
    assert policy.own_origins(("::1", 41234, 0, 0)) == policy.own_origins(("127.0.0.1", 41234))
    assert "http://127.0.0.1" in policy.own_origins(("127.0.0.1", 80))  # the default port left out
    assert policy.own_origins(None) == frozenset()  # the connection is gone


def test_a_wider_bind_owns_only_the_address_a_request_arrived_on() -> None:
    policy = OriginPolicy("0.0.0.0", (), None)
    assert policy.own_origins(("192.168.1.2", 8080)) == {"http://192.168.1.2:8080"}
    assert policy.own_origins(("127.0.0.1", 8080)) == {"http://127.0.0.1:8080"}  # not a loopback bind
    assert OriginPolicy("::", (), None).own_origins(("fe80::1", 8080, 0, 0)) == {"http://[fe80::1]:8080"}


@pytest.mark.parametrize(
    ("url", "origin", "hosts"),
    [
        ("https://gw.example/", "https://gw.example", {"gw.example", "gw.example:443"}),
        ("http://gw.example:8443/base/", "http://gw.example:8443", {"gw.example:8443"}),
        ("http://[2001:db8::1]/", "http://[2001:db8::1]", {"[2001:db8::1]", "[2001:db8::1]:80"}),
        ("https://[2001:db8::1]:9443/", "https://[2001:db8::1]:9443", {"[2001:db8::1]:9443"}),
    ],
)
def test_the_public_base_urls_origin_and_host_are_the_listeners_own(url: str, origin: str, hosts: set[str]) -> None:
    policy = OriginPolicy("127.0.0.1", ("https://app.example",), url)
    assert policy.origins == {"https://app.example", origin}
    for host in hosts:
        assert policy.host_allowed(host, LOOPBACK)
    assert not policy.host_allowed("other.example", LOOPBACK)


def test_origins_are_compared_exactly() -> None:
    policy = OriginPolicy("127.0.0.1", ("https://app.example",), None)
    assert policy.origin_allowed("https://app.example", LOOPBACK)
    assert policy.origin_allowed("http://localhost:8080", LOOPBACK)
    for foreign in ("https://app.example/", "https://APP.example", "http://127.0.0.1:8081", "http://evil.example"):
        assert not policy.origin_allowed(foreign, LOOPBACK), foreign
    assert not policy.origin_allowed("null", LOOPBACK)


def test_a_foreign_host_is_refused_only_on_a_loopback_bind() -> None:
    assert OriginPolicy("127.0.0.1", (), None).check_host
    assert not OriginPolicy("0.0.0.0", (), None).check_host
    assert not OriginPolicy("192.168.1.2", (), None).check_host
    policy = OriginPolicy("127.0.0.1", (), None)
    assert not policy.host_allowed("evil.example:8080", LOOPBACK)
    # The same config bound wider (--host 0.0.0.0) answers what arrives on another address.
    assert policy.host_allowed("gateway.example:8080", ("192.168.1.2", 8080))
    assert not policy.host_allowed("evil.example", None)  # the connection is gone


def test_accepted_hosts_are_remembered_up_to_a_bound_and_refused_ones_never() -> None:
    policy = OriginPolicy("127.0.0.1", (), None)
    assert policy.host_allowed("127.0.0.1:41234", LOOPBACK)
    assert "127.0.0.1:41234" in policy.hosts  # from now on one lookup on the hot path
    assert not policy.host_allowed("evil.example", LOOPBACK)
    assert "evil.example" not in policy.hosts
    for port in range(1, 2 * MAX_REMEMBERED_HOSTS):
        assert policy.host_allowed(f"localhost:{port}", LOOPBACK)
    assert len(policy.hosts) == MAX_REMEMBERED_HOSTS
    assert policy.host_allowed(f"localhost:{10 * MAX_REMEMBERED_HOSTS}", LOOPBACK)  # still judged


# -- through a gateway ------------------------------------------------------------------------


class Gateway:
    def __init__(self, client: TestClient[Any, Any], upstream: FakeUpstream) -> None:
        self.client = client
        self.upstream = upstream
        port = client.server.port
        assert port is not None
        self.port = port

    async def post(self, method: str = "tools/list", **headers: str) -> aiohttp.ClientResponse:
        return await self.client.post(
            "/servers/up/mcp", data=orjson.dumps(rpc(method, id_=7)), headers=mcp_headers(method, **headers)
        )


MakeGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture(params=[True, False], ids=["hot", "plain"])
async def make_gateway(
    request: pytest.FixtureRequest, aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream
) -> MakeGateway:
    async def make(**config: Any) -> Gateway:
        upstream = await start_upstream()
        cfg = {"upstreams": {"up": {"url": upstream.url}}, "registry": {"enabled": False}, **config}
        app = create_app(parse_config(cfg, env={}), hot_path=request.param)
        # Port 0: the listener's port is chosen at run time, as in every test.
        return Gateway(await aiohttp_client(await aiohttp_server(app, host="127.0.0.1", port=0)), upstream)

    return make


async def rejected(resp: aiohttp.ClientResponse) -> tuple[int, int, bool]:
    """Status, JSON-RPC code, whether the body carries an id (it must not: it was not read)."""
    body = await resp.json()
    assert body["jsonrpc"] == "2.0" and "detail=rejected" in resp.headers["Cache-Status"]
    return resp.status, body["error"]["code"], "id" in body


async def test_the_listeners_own_origins_are_allowed_with_no_allowed_origins(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    for name in ("127.0.0.1", "localhost", "[::1]"):
        for _ in range(2):  # a miss, then a hit
            resp = await gw.post(Origin=f"http://{name}:{gw.port}")
            assert resp.status == 200, name
    assert gw.upstream.count("tools/list") == 1


async def test_a_foreign_origin_is_403_before_the_cache_even_on_a_hit(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(listener={"allowed_origins": ["https://app.example"]})
    assert (await gw.post()).status == 200
    assert "hit" in (await gw.post(Origin="https://app.example")).headers["Cache-Status"]
    other_port = 1 if gw.port != 1 else 2
    for origin in ("http://evil.example", f"http://evil.example:{gw.port}", f"http://127.0.0.1:{other_port}", "null"):
        assert await rejected(await gw.post(Origin=origin)) == (403, -32600, False), origin
    assert gw.upstream.count("tools/list") == 1


async def test_the_public_base_urls_origin_and_host_are_allowed(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(registry={"enabled": False, "public_base_url": "https://mcp.example/"})
    resp = await gw.post(Origin="https://mcp.example", Host="mcp.example")
    assert resp.status == 200
    assert await rejected(await gw.post(Origin="https://mcp.example:8443")) == (403, -32600, False)


async def test_a_foreign_host_on_a_loopback_bind_is_421_even_on_a_hit(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    assert (await gw.post()).status == 200
    for host in ("evil.example", f"evil.example:{gw.port}", "127.0.0.2", "localhost.evil.example"):
        assert await rejected(await gw.post(Host=host)) == (421, -32600, False), host
    # Host is judged first, as the SDK servers do: a rebinding page sends both.
    resp = await gw.post(Host="evil.example", Origin="http://evil.example")
    assert (await rejected(resp))[0] == 421
    assert gw.upstream.count("tools/list") == 1


async def test_loopback_host_names_pass_with_any_port_or_none(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    for host in ("localhost", "127.0.0.1", "[::1]", f"localhost:{gw.port}", f"[::1]:{gw.port}", "LOCALHOST:1"):
        assert (await gw.post(Host=host)).status == 200, host


async def test_a_listener_not_bound_to_loopback_does_not_check_host(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(listener={"host": "0.0.0.0"})
    assert (await gw.post(Host="gateway.example")).status == 200
    # Its own origin is still the address a request arrived on, not every loopback name.
    assert (await gw.post(Origin=f"http://127.0.0.1:{gw.port}")).status == 200
    assert (await rejected(await gw.post(Origin=f"http://localhost:{gw.port}")))[0] == 403


async def test_the_legacy_stream_routes_are_guarded_alike(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    for method in ("GET", "DELETE"):
        resp = await gw.client.request(method, "/servers/up/mcp", headers={"Host": "evil.example"})
        assert await rejected(resp) == (421, -32600, False)
        resp = await gw.client.request(method, "/servers/up/mcp", headers={"Origin": "http://evil.example"})
        assert await rejected(resp) == (403, -32600, False)
    assert gw.upstream.requests == []


async def test_the_routes_that_tell_about_the_fleet_are_guarded_alike(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    for path in ("/v0.1/servers", "/registry/versions", "/metrics", "/v0.1/servers/x/versions"):
        resp = await gw.client.get(path, headers={"Host": f"evil.example:{gw.port}"})
        body = await resp.json()
        assert (resp.status, body["error"]["code"]) == (421, -32600), path
        resp = await gw.client.get(path, headers={"Origin": "http://evil.example"})
        assert resp.status == 403, path
        resp = await gw.client.get(path, headers={"Origin": f"http://localhost:{gw.port}"})
        assert resp.status in (200, 404), path  # its own origin passes (404: no server x)
    assert (await gw.client.get("/healthz", headers={"Host": "evil.example"})).status == 200


async def test_a_listener_on_another_loopback_address_answers_to_that_address(
    aiohttp_server: Any, aiohttp_client: Any, start_upstream: StartUpstream
) -> None:
    upstream = await start_upstream()
    config = {
        "listener": {"host": "127.0.0.2"},
        "upstreams": {"up": {"url": upstream.url}},
        "registry": {"enabled": False},
    }
    app = create_app(parse_config(config, env={}))
    gw = Gateway(await aiohttp_client(await aiohttp_server(app, host="127.0.0.2", port=0)), upstream)
    assert (await gw.post(Host=f"127.0.0.2:{gw.port}", Origin=f"http://127.0.0.2:{gw.port}")).status == 200
    assert (await gw.post(Host="127.0.0.3")).status == 421
