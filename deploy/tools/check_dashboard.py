"""Checks the Grafana dashboard JSON (standard library only).

    python3 check_dashboard.py [--promtool PATH] dashboard.json

* the file parses as JSON and has a title, a uid and panels;
* there is a datasource template variable, and every panel and query uses it
  (no hard-coded datasource uid);
* panel ids are unique and every panel has a gridPos;
* with --promtool: every PromQL expression (template variables replaced by
  harmless values) parses, by running `promtool check rules` on a temporary
  rules file made of them.

Exits 1 on failure.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

DS_REF = "${datasource}"
SUBSTITUTIONS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
}


def iter_panels(panels):
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for p in iter_panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((p.get("title", "?"), t["expr"]))
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        if v.get("type") == "query":
            q = q.get("query") if isinstance(q, dict) else q
            m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", q or "")
            if m:  # label_values(selector, label): check the selector
                out.append((f"variable {v['name']}", m.group(1)))
    return out


def substitute(expr: str) -> str:
    for k, v in SUBSTITUTIONS.items():
        expr = expr.replace(k, v)
    # remaining dashboard variables are only used inside =~"..." matchers
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def check(path: pathlib.Path, promtool: str | None) -> list[str]:
    errors = []
    try:
        dash = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{path}: does not parse as JSON: {exc}"]
    for key in ("title", "uid", "panels"):
        if not dash.get(key):
            errors.append(f"missing top-level {key!r}")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds_var = variables.get("datasource")
    if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
        errors.append("no 'datasource' template variable of type datasource/prometheus")
    ids = []
    for p in iter_panels(dash.get("panels", [])):
        title = p.get("title", "?")
        ids.append(p.get("id"))
        if "gridPos" not in p:
            errors.append(f"panel {title!r}: no gridPos")
        if p.get("type") == "row":
            continue
        if (p.get("datasource") or {}).get("uid") != DS_REF:
            errors.append(f"panel {title!r}: datasource is not {DS_REF}")
        if not p.get("targets"):
            errors.append(f"panel {title!r}: no queries")
        for t in p.get("targets", []):
            if (t.get("datasource") or {}).get("uid") != DS_REF:
                errors.append(f"panel {title!r} query {t.get('refId')}: datasource is not {DS_REF}")
    for v in variables.values():
        if v.get("type") == "query" and (v.get("datasource") or {}).get("uid") != DS_REF:
            errors.append(f"variable {v.get('name')!r}: datasource is not {DS_REF}")
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        errors.append(f"duplicate panel ids: {sorted(dupes)}")

    exprs = expressions(dash)
    if promtool and exprs:
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:expr_{i}", "expr": substitute(e)} for i, (_, e) in enumerate(exprs)]}]}
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as fh:
            json.dump(rules, fh)  # JSON is valid YAML
        proc = subprocess.run([promtool, "check", "rules", fh.name], capture_output=True, text=True)
        pathlib.Path(fh.name).unlink()
        if proc.returncode != 0:
            errors.append("PromQL does not parse:\n" + proc.stdout + proc.stderr)
    print(f"dashboard: {len(ids)} panels, {len(exprs)} PromQL expressions"
          + (" parsed by promtool" if promtool else " (PromQL not parsed: no --promtool)"))
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dashboard", type=pathlib.Path)
    ap.add_argument("--promtool")
    args = ap.parse_args()
    errors = check(args.dashboard, args.promtool)
    for e in errors:
        print(f"ERROR {e}")
    print(f"dashboard: {'FAILED' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
