"""The demo's two MCP servers, made with the official SDK: ``weather`` (public cache hints) and
``notes`` (private, per-user data). Each runs in a child process of the demo
(``python -m gateway.demo serve-upstream NAME PORT``); only this module imports the ``mcp`` SDK
(the ``demo`` extra), and only when a server is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import zlib
from collections.abc import Callable
from datetime import date, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from mcp.server import MCPServer

__all__ = ["BUILDERS", "CITIES", "HOST", "MCP_PATH", "serve_upstream"]

HOST: Final = "127.0.0.1"
MCP_PATH: Final = "/mcp"


class DayForecast(BaseModel):
    """One day of a (made-up) forecast."""

    date: str
    summary: str
    high_c: int
    low_c: int
    precipitation_pct: int


class Forecast(BaseModel):
    """A multi-day forecast for one city."""

    city: str
    days: list[DayForecast]


class Alert(BaseModel):
    """One active weather alert."""

    region: str
    severity: Literal["minor", "moderate", "severe"]
    headline: str


class Note(BaseModel):
    """One of the user's notes."""

    id: str
    title: str
    text: str


CITIES: Final = ("Amsterdam", "Berlin", "Lisbon", "Nairobi", "Paris", "Tokyo")
_SKIES: Final = ("sunny", "partly cloudy", "cloudy", "light rain", "showers", "windy")
_ALERTS: Final[dict[str, list[tuple[Literal["minor", "moderate", "severe"], str]]]] = {
    "north-sea": [("moderate", "Gale-force winds along the coast until Friday")],
    "alps": [("severe", "Avalanche danger level 4 above 2000 m"), ("minor", "Fresh snow on passes")],
}


def _seed(*parts: object) -> int:
    return zlib.crc32("/".join(str(p).lower() for p in parts).encode())


def _forecast(city: str, days: int) -> Forecast:
    today = date.today()
    out: list[DayForecast] = []
    for i in range(days):
        s = _seed(city, i)
        high = 8 + s % 20
        out.append(
            DayForecast(
                date=(today + timedelta(days=i)).isoformat(),
                summary=_SKIES[s % len(_SKIES)],
                high_c=high,
                low_c=high - 4 - s % 6,
                precipitation_pct=(s >> 8) % 90,
            )
        )
    return Forecast(city=city, days=out)


def build_weather() -> MCPServer[Any]:
    """The ``weather`` upstream: public cache hints, ttl 60 s, on discovery, lists and reads."""
    from mcp.server import MCPServer
    from mcp.server.caching import CacheableMethod, CacheHint

    public = CacheHint(ttl_ms=60_000, scope="public")
    methods: tuple[CacheableMethod, ...] = (
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    )
    srv: MCPServer[Any] = MCPServer(
        "weather",
        version="1.0.0",
        instructions="Made-up weather forecasts and alerts (mcp-gateway demo).",
        cache_hints=dict.fromkeys(methods, public),
    )

    @srv.tool()
    def get_forecast(city: str, days: Annotated[int, Field(ge=1, le=7)] = 3) -> Forecast:
        """Forecast for `city` over the next `days` days (1-7)."""
        return _forecast(city, days)

    @srv.tool()
    def get_alerts(region: str) -> list[Alert]:
        """Active weather alerts for `region` (try "alps" or "north-sea")."""
        return [Alert(region=region, severity=sev, headline=text) for sev, text in _ALERTS.get(region.lower(), [])]

    @srv.resource("weather://cities", name="cities", mime_type="application/json")
    def cities() -> str:
        """The cities with forecasts."""
        return json.dumps(list(CITIES))

    @srv.resource("weather://forecast/{city}", name="forecast", mime_type="application/json")
    def forecast(city: str) -> str:
        """Three-day forecast for one city."""
        return _forecast(city, 3).model_dump_json()

    @srv.prompt()
    def plan_outdoor_day(city: str, activity: str = "a long walk") -> str:
        """Ask the model to plan an outdoor day around the forecast."""
        return f"Use the get_forecast tool for {city} and suggest the best day this week for {activity}."

    return srv


def build_notes() -> MCPServer[Any]:
    """The ``notes`` upstream: per-user data, so lists and reads are ``private``."""
    from mcp.server import MCPServer
    from mcp.server.caching import CacheableMethod, CacheHint

    private = CacheHint(ttl_ms=30_000, scope="private")
    methods: tuple[CacheableMethod, ...] = (
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    )
    hints: dict[CacheableMethod, CacheHint] = dict.fromkeys(methods, private)
    hints["server/discover"] = CacheHint(ttl_ms=60_000, scope="public")  # the same for everyone
    srv: MCPServer[Any] = MCPServer(
        "notes",
        version="1.0.0",
        instructions="A user's personal notes (mcp-gateway demo; per-user, so never shared).",
        cache_hints=hints,
    )
    notes: dict[str, Note] = {
        "1": Note(id="1", title="Groceries", text="oat milk, lemons, basil"),
        "2": Note(id="2", title="Trip", text="Book the Lisbon train before Friday"),
    }

    @srv.tool()
    def add_note(title: str, text: str) -> Note:
        """Save a new note."""
        note = Note(id=str(len(notes) + 1), title=title, text=text)
        notes[note.id] = note
        return note

    @srv.tool()
    def search_notes(query: str) -> list[Note]:
        """Notes whose title or text contains `query` (case-insensitive)."""
        q = query.lower()
        return [n for n in notes.values() if q in n.title.lower() or q in n.text.lower()]

    @srv.resource("notes://recent", name="recent", mime_type="application/json")
    def recent() -> str:
        """The user's most recent notes."""
        return json.dumps([n.model_dump() for n in list(notes.values())[-5:]])

    @srv.resource("notes://note/{note_id}", name="note", mime_type="text/plain")
    def note(note_id: str) -> str:
        """One note's text."""
        found = notes.get(note_id)
        if found is None:
            raise ValueError(f"no note {note_id}")
        return f"{found.title}\n\n{found.text}"

    @srv.prompt()
    def summarize_notes() -> str:
        """Ask the model to summarise the user's notes."""
        return "Read notes://recent and summarise my notes as a short to-do list."

    return srv


BUILDERS: Final[dict[str, Callable[[], MCPServer[Any]]]] = {"weather": build_weather, "notes": build_notes}


def _exit_when_stdin_closes() -> None:
    """Block until stdin reaches EOF (the demo went away), then stop this process."""
    with contextlib.suppress(OSError, ValueError):
        while sys.stdin.buffer.read(4096):
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def serve_upstream(name: str, port: int, *, exit_on_stdin_eof: bool = False) -> None:
    """Serve demo upstream ``name`` on http://127.0.0.1:PORT/mcp until SIGINT/SIGTERM."""
    import uvicorn

    server = BUILDERS[name]()
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=HOST)
    if exit_on_stdin_eof:
        threading.Thread(target=_exit_when_stdin_closes, name="parent-watch", daemon=True).start()
    uvicorn.run(app, host=HOST, port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
