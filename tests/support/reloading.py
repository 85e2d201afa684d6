"""Driving a reload in tests: one ``mcp-gateway serve`` process (tests/support/replicas.py), its
config file rewritten, ``SIGHUP`` (``os.kill``) or ``POST /admin/reload``, and a steady load of
callers across it.

    async with gateway(tmp_path, {"upstreams": {"a": public(up)}}) as gw:
        sha = rewrite(gw, {"upstreams": {"a": public(up), "b": public(other)}})
        await sighup(gw, sha)                      # returns once /readyz shows that config
        status, body = await admin_reload(http, gw)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import os
import signal
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from .fleet import Upstream
from .polling import wait_until
from .replicas import ADMIN_TOKEN, Replicas, dump_toml
from .reply import Reply
from .wire import mcp_headers, rpc

__all__ = [
    "admin_reload",
    "begun",
    "gateway",
    "public",
    "rewrite",
    "served_sha",
    "sighup",
    "steady_load",
    "tools_list",
]


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, config: Mapping[str, Any]) -> AsyncIterator[Replicas]:
    """One ``mcp-gateway serve`` process of ``config`` (with an ``[admin]`` table), stopped at the end."""
    gw = Replicas(config, 1, tmp_path)
    try:
        await gw.start_all()
        yield gw
    finally:
        await gw.close()


def rewrite(gw: Replicas, config: Mapping[str, Any], index: int = 0) -> str:
    """``config`` as the file of the gateway (of replica ``index``), its port and admin token kept
    unless ``config`` sets them; the SHA-256 of the bytes written."""
    path = gw[index].config_path
    current = tomllib.loads(path.read_text())
    one = copy.deepcopy(dict(config))
    one.setdefault("admin", current["admin"])
    one["listener"] = {**current["listener"], **one.get("listener", {})}
    text = dump_toml(one)
    path.write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


async def served_sha(gw: Replicas, index: int = 0) -> str | None:
    _, body = await gw.get(index, "/readyz")
    return body.get("config_sha256") if isinstance(body, dict) else None


async def sighup(gw: Replicas, sha256: str) -> None:
    """``SIGHUP`` to the gateway, and wait until it serves the file of ``sha256``."""
    assert gw[0].process is not None
    os.kill(gw[0].process.pid, signal.SIGHUP)

    async def serving() -> bool:
        return await served_sha(gw) == sha256

    await wait_until(serving, limit_s=10, what=f"the gateway to serve config {sha256[:12]}")


async def admin_reload(http: aiohttp.ClientSession, gw: Replicas, index: int = 0) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with http.post(f"{gw.base_url(index)}/admin/reload", headers=headers) as resp:
        return resp.status, await resp.json()


async def tools_list(
    http: aiohttp.ClientSession, url: str, id_: int = 1, headers: Mapping[str, str] | None = None
) -> Reply:
    body = json.dumps(rpc("tools/list", id_)).encode()
    async with http.post(url, data=body, headers={**mcp_headers("tools/list"), **(headers or {})}) as resp:
        return Reply(resp.status, resp.headers, await resp.read())


async def steady_load(
    http: aiohttp.ClientSession, urls: list[str], stop: asyncio.Event, *, callers: int = 4, most: int = 3000
) -> tuple[int, list[str]]:
    """``callers`` concurrent callers sending ``tools/list`` round the ``urls`` until ``stop``
    (at most ``most`` requests each): how many were sent, and the failures."""
    failures: list[str] = []
    sent = 0

    async def caller(index: int) -> None:
        nonlocal sent
        for i in range(most):
            if stop.is_set():
                return
            url = urls[(index + i) % len(urls)]
            try:
                reply = await tools_list(http, url, i)
                if reply.status != 200 or "result" not in reply.json:
                    failures.append(f"{url}: HTTP {reply.status} {reply.raw[:200]!r}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures.append(f"{url}: {exc!r}")
            sent += 1

    await asyncio.gather(*(caller(i) for i in range(callers)))
    return sent, failures


def public(up: Upstream, **more: Any) -> dict[str, Any]:
    return {"url": up.url, **more}


@contextlib.asynccontextmanager
async def begun(port: int, path: str, message: object) -> AsyncIterator[Callable[[], Awaitable[bytes]]]:
    """A POST of the JSON-RPC ``message`` (an MCP ``tools/list``'s headers) to ``path`` on
    127.0.0.1:``port`` whose handler has begun, holding the config served now, and whose body is
    not sent yet: ``await finish()`` sends it and returns the whole response (at most 10 s)."""
    body = json.dumps(message).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in mcp_headers("tools/list").items()]
    head += ["Expect: 100-continue", "Connection: close"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write("\r\n".join([*head, "", ""]).encode())
        await writer.drain()
        # aiohttp answers "100 Continue" once the route is found, just before its handler runs.
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert interim.startswith(b"HTTP/1.1 100"), interim

        async def finish() -> bytes:
            writer.write(body)
            await writer.drain()
            return await asyncio.wait_for(reader.read(), timeout=10)

        yield finish
    finally:
        writer.close()
