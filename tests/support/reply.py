"""An HTTP answer as the end-to-end tests read it: status, headers, body, and what they mean
(the ``Cache-Status`` parameters, the JSON-RPC response in a JSON or SSE body)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDictProxy

from .wire import sse_messages

__all__ = ["Reply"]


@dataclass
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    raw: bytes
    elapsed_s: float = 0.0

    @property
    def cache_status(self) -> str:
        return self.headers.get("Cache-Status", "")

    @property
    def cache_params(self) -> list[str]:
        """``Cache-Status`` split at ``;``, e.g. ``["mcp-gateway", "hit", "ttl=59"]``."""
        return [part.strip() for part in self.cache_status.split(";")]

    @property
    def cache_hit(self) -> bool:
        params = self.cache_params
        assert params[0] == "mcp-gateway", self.cache_status
        return "hit" in params[1:]

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip()

    def messages(self) -> list[dict[str, Any]]:
        if self.content_type == "text/event-stream":
            return sse_messages(self.raw)
        return [json.loads(self.raw)]

    @property
    def json(self) -> dict[str, Any]:
        """The JSON-RPC response (the last message carrying a result or an error)."""
        responses = [m for m in self.messages() if "result" in m or "error" in m]
        assert responses, f"no JSON-RPC response in {self.raw!r} (HTTP {self.status})"
        return responses[-1]

    @property
    def result(self) -> dict[str, Any]:
        msg = self.json
        assert "result" in msg, f"expected a result, got {msg} (HTTP {self.status})"
        return dict(msg["result"])

    @property
    def error(self) -> dict[str, Any]:
        msg = self.json
        assert "error" in msg, f"expected an error, got {msg} (HTTP {self.status})"
        return dict(msg["error"])
