"""Talking to one upstream MCP server over HTTP, and mapping transport failures.

Every aiohttp / asyncio failure on the way to an upstream is translated here, once, into
the gateway's own :class:`~gateway.protocol.BadGateway` (502) or
:class:`~gateway.protocol.GatewayTimeout` (504). Redirects are never followed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Final

import aiohttp
from multidict import CIMultiDict

from .config import UpstreamConfig
from .errors import BadGateway, GatewayTimeout, HeaderMismatch

__all__ = ["RESPONSE_HEADERS", "Upstream"]

#: Request headers passed to the upstream as they are (MCP 2026-07-28, Streamable HTTP transport,
#: "Request Metadata" and "Server Behavior for Custom Headers": routing headers reach the server).
#: ``Authorization`` is added only for upstreams with ``forward_authorization``; ``Host``
#: is the upstream's own (aiohttp sets it from the URL); hop-by-hop headers never pass.
REQUEST_HEADERS: Final = frozenset(
    h.lower()
    for h in (
        "MCP-Protocol-Version",
        "Mcp-Method",
        "Mcp-Name",
        "Accept",
        "Content-Type",
        "Mcp-Session-Id",
        "Last-Event-ID",
        "traceparent",
        "tracestate",
        "baggage",
    )
)
_PARAM_PREFIX: Final = "mcp-param-"

#: Response headers passed back to the caller.
RESPONSE_HEADERS: Final = ("Content-Type", "WWW-Authenticate", "Mcp-Session-Id", "Retry-After", "Allow")

_CHUNK: Final = 64 * 1024
#: What cannot be forwarded unchanged: control characters, and bytes that were not UTF-8
#: (aiohttp reads them as lone surrogates and would drop them on the way out).
_UNFORWARDABLE: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f\ud800-\udfff]")


def forwarded_name(name: str) -> str:
    """The lower-case form of a request header ``name`` if it may be forwarded (``authorization``
    subject to the upstream's configuration), else ``""``."""
    low = name.lower()
    return low if low in REQUEST_HEADERS or low.startswith(_PARAM_PREFIX) or low == "authorization" else ""


class _Load:
    """What is under way to one upstream, whichever of its configs it began on."""

    __slots__ = ("inflight", "listening")

    def __init__(self) -> None:
        self.inflight = 0
        self.listening = 0


class Upstream:
    """One configured upstream, sharing the app's ``aiohttp.ClientSession``.

    ``timeout_s`` bounds a non-streamed exchange (headers and body); ``connect_timeout_s``
    the TCP connect; ``stream_idle_timeout_s`` the silence allowed between two reads of a
    stream (SSE keep-alive comments count as bytes). Its config never changes: a reload that
    changes it makes a new one (:meth:`retuned`), and a request keeps the one it began with.
    """

    def __init__(
        self, name: str, config: UpstreamConfig, session: aiohttp.ClientSession, *, load: _Load | None = None
    ) -> None:
        self.name = name
        self.config = config
        self.url = str(config.url)
        self._session = session
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout_s, sock_read=config.stream_idle_timeout_s
        )
        self._load = _Load() if load is None else load

    def retuned(self, config: UpstreamConfig) -> Upstream:
        """This upstream under ``config`` (the same ``url``, another timeout or bound): the same
        session, and the same count of what is under way, so that ``max_inflight`` and
        ``max_listen_streams`` bound the requests begun on either config together."""
        return Upstream(self.name, config, self._session, load=self._load)

    #: Requests being forwarded now, and callers' listen streams open now (bounded apart).
    @property
    def inflight(self) -> int:
        return self._load.inflight

    @inflight.setter
    def inflight(self, value: int) -> None:
        self._load.inflight = value

    @property
    def listening(self) -> int:
        return self._load.listening

    @listening.setter
    def listening(self, value: int) -> None:
        self._load.listening = value

    def request_headers(self, incoming: Mapping[str, str], *, allow_authorization: bool) -> CIMultiDict[str]:
        """The headers to send upstream: the allowed subset of ``incoming``, values unchanged,
        every ``Mcp-Param-*``, then this upstream's configured headers (which win).

        Raises:
            HeaderMismatch: a header to forward has control characters or bytes that are not
                UTF-8, so it could not be passed on unchanged (streamable-http Server
                Validation: invalid characters are rejected with -32020).
        """
        out: CIMultiDict[str] = CIMultiDict()
        spelling: dict[str, str] = {}
        with_authorization = allow_authorization and self.config.forward_authorization
        for name, value in incoming.items():
            low = forwarded_name(name)
            if not low or (low == "authorization" and not with_authorization):
                continue
            # One spelling per header: aiohttp's client keeps repeated headers only when
            # their names are spelled alike, and would let a later "mcp-name" replace an
            # earlier "Mcp-Name".
            name = spelling.setdefault(low, name)
            # Visible ASCII (the usual value) is forwardable as it is; else the full check.
            if not (value.isascii() and value.isprintable()) and _UNFORWARDABLE.search(value):
                raise HeaderMismatch(f"Header mismatch: {name} has bytes that cannot be forwarded unchanged")
            out.add(name, value)
        for name, value in self.config.headers.items():
            out[name] = value
        return out

    @asynccontextmanager
    async def open(
        self, http_method: str, body: bytes | None, headers: CIMultiDict[str]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one HTTP request and yield the response once its headers arrived.

        Raises:
            GatewayTimeout: no response headers within ``timeout_s``.
            BadGateway: refused, reset, unreachable, or a redirect (never followed).
        """
        try:
            async with asyncio.timeout(self.config.timeout_s):
                resp = await self._session.request(
                    http_method,
                    self.url,
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                    timeout=self._timeout,
                )
        except TimeoutError as exc:
            raise GatewayTimeout(f"upstream {self.name} did not answer within {self.config.timeout_s:g} s") from exc
        except aiohttp.ClientError as exc:
            raise BadGateway(f"upstream {self.name} is unreachable ({type(exc).__name__})") from exc
        try:
            if 300 <= resp.status < 400:
                raise BadGateway(f"upstream {self.name} answered with a redirect ({resp.status}); not followed")
            yield resp
        finally:
            if resp.content.at_eof():
                resp.release()
            else:
                resp.close()

    async def read_body(self, resp: aiohttp.ClientResponse, deadline: float) -> bytes:
        """Read a whole non-streamed body, at most ``max_response_bytes``, by loop time ``deadline``.

        Raises:
            GatewayTimeout: the body did not arrive in time.
            BadGateway: the body is too large or the connection broke.
        """
        limit = self.config.max_response_bytes
        if resp.content_length is not None and resp.content_length > limit:
            raise BadGateway(f"upstream {self.name} response exceeds {limit} bytes")
        content = resp.content
        if content.is_eof() and content.exception() is None:
            # The whole body came with the headers (the usual case on a LAN): no waiting,
            # so no timer to arm.
            data = content.read_nowait()
            if len(data) > limit:
                raise BadGateway(f"upstream {self.name} response exceeds {limit} bytes")
            return data
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout_at(deadline):
                while chunk := await resp.content.read(_CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise BadGateway(f"upstream {self.name} response exceeds {limit} bytes")
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise GatewayTimeout(
                f"upstream {self.name} did not finish its answer within {self.config.timeout_s:g} s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise BadGateway(f"upstream {self.name} broke off its answer ({type(exc).__name__})") from exc
        return b"".join(chunks)

    async def iter_stream(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """Yield a streamed body's chunks as they arrive; stop quietly when the upstream
        ends, breaks off, or stays silent past ``stream_idle_timeout_s``.

        Returns normally in every case: whether the stream carried its answer is for the
        caller to tell (it looks for the final JSON-RPC response).
        """
        try:
            while True:
                chunk = await resp.content.readany()
                if not chunk:
                    return
                yield chunk
        except (aiohttp.ClientError, TimeoutError):
            return
