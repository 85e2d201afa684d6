"""The MCP routes ``/servers/{name}/mcp``.

Modules, lower first: ``exchange`` (one request's state and its ``Cache-Status``), ``origin``
(the ``Origin`` and ``Host`` rules against DNS rebinding), ``writing`` (writing to callers,
bounded), ``fetch`` and ``stream`` (reading an upstream's answer whole, relaying an SSE one),
``forward`` (to the upstream and back, keeping a miss's answer), ``pipeline`` (the one request
pipeline of every MCP route: validate, authenticate, look up and answer, record), ``handler``
(this route's steps, the plain path), ``hot`` (the served proxy: the hit path's speed-ups, beside
the plain methods they must equal).
"""

from .exchange import CACHE_NAME, Exchange
from .handler import Proxy
from .hot import HotProxy

__all__ = ["CACHE_NAME", "Exchange", "HotProxy", "Proxy"]
