"""What the test modules share, written once.

* :mod:`.wire`: the MCP wire as a correct client writes it: ``V``, ``ACCEPT``, the ``_meta`` keys,
  :func:`rpc`, :func:`mcp_headers`, the header sentinel, a reference SSE reader.
* :mod:`.upstream`: :class:`FakeUpstream`, the one scriptable aiohttp upstream (served by the
  ``start_upstream`` fixture); each test writes its own handlers.
* :mod:`.scripted_mcp`: :class:`ScriptedMcp`, a modern MCP upstream whose discover answer and
  listen streams the test scripts (the registry tests).
* :mod:`.clock`: :class:`FakeClock`, :class:`FakeTime` (a clock with a ``sleep``),
  :class:`RecordingSleep`. :mod:`.polling`: :func:`wait_until`, a bounded poll; :mod:`.coalescing`:
  :class:`Followers`, the requests waiting on a coalescing leader (a state to poll for).
  :mod:`.running`: :class:`RunningGateway` (the ``start_gateway`` fixture's value).
* :mod:`.fleet`: the real SDK servers of ``tests/servers/``, run as subprocesses (the legacy
  one on the older SDK too). :mod:`.conformance`: the official conformance suite.
* :mod:`.authserver`: a real OAuth authorization server (oidc-provider, ``oidc/provider.mjs``);
  :mod:`.oauth_client`: the SDK's own OAuth client in front of the gateway, its user played over
  HTTP. :mod:`.idp`: a scriptable identity provider (a JWKS, introspection, fault modes).
* :mod:`.cache`, :mod:`.telemetry`: builders for the unit tests of those subpackages.

The names most modules need are importable from here.
"""

from .clock import FakeClock
from .running import RunningGateway, StartGateway
from .upstream import FakeUpstream, Handler, Received, StartUpstream, answer_tools_list
from .wire import (
    ACCEPT,
    CACHEABLE,
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LEGACY_V,
    LEGACY_VERSIONS,
    NAME_FIELD,
    PROTOCOL_VERSION_KEY,
    SENTINEL_PREFIX,
    SENTINEL_SUFFIX,
    V,
    header_value,
    list_result,
    mcp_headers,
    request_meta,
    rpc,
    sentinel,
    sse_events,
    sse_frame,
    sse_messages,
)

__all__ = [
    "ACCEPT",
    "CACHEABLE",
    "CLIENT_CAPABILITIES_KEY",
    "CLIENT_INFO_KEY",
    "LEGACY_V",
    "LEGACY_VERSIONS",
    "NAME_FIELD",
    "PROTOCOL_VERSION_KEY",
    "SENTINEL_PREFIX",
    "SENTINEL_SUFFIX",
    "FakeClock",
    "FakeUpstream",
    "Handler",
    "Received",
    "RunningGateway",
    "StartGateway",
    "StartUpstream",
    "V",
    "answer_tools_list",
    "header_value",
    "list_result",
    "mcp_headers",
    "request_meta",
    "rpc",
    "sentinel",
    "sse_events",
    "sse_frame",
    "sse_messages",
]
