"""The MCP routes ``/servers/{name}/mcp``.

Modules, lower first: ``exchange`` (one request's state and its ``Cache-Status``), ``origin``
(the ``Origin`` and ``Host`` rules against DNS rebinding), ``forward`` (to the upstream and
back, storing what may be stored), ``handler`` (the plain path:
validate, look up, answer), ``hot`` (the served proxy: the hit path's speed-ups, each beside
the plain method it must equal).
"""

from .exchange import CACHE_NAME, Exchange
from .handler import Proxy
from .hot import HotProxy

__all__ = ["CACHE_NAME", "Exchange", "HotProxy", "Proxy"]
