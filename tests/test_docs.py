"""The documentation against the code: docs/ names every config key, metric and shipped alert
(and nothing that does not exist), and the README stays a short page that links into docs/.

`make docs` (mkdocs build --strict) checks the links inside docs/; these tests check what it
cannot: that the pages say what the code does, and the README's links (outside the site).
"""

from __future__ import annotations

import pathlib
import re
import types
import typing
from collections.abc import Iterator, Mapping

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel

from gateway.config.model import GatewayConfig
from gateway.telemetry.metrics import GatewayMetrics

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250

_CODE = re.compile(r"`([^`]+)`")


def _model(annotation: object) -> type[BaseModel] | None:
    """The config table an annotation holds (``X``, ``X | None``), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_model, typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def _config_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key of the config file as the docs write it: ``cache.max_ttl_ms``,
    ``upstreams.NAME.url`` (a map of tables is written with ``NAME``)."""
    for name, field in model.model_fields.items():
        table = _model(field.annotation)
        if table is not None:
            yield from _config_keys(table, f"{prefix}{name}.")
            continue
        origin = typing.get_origin(field.annotation)
        args = typing.get_args(field.annotation)
        if origin is not None and issubclass(origin, Mapping) and args and _model(args[1]) is not None:
            yield from _config_keys(typing.cast(type[BaseModel], _model(args[1])), f"{prefix}{name}.NAME.")
            continue
        yield f"{prefix}{name}"


def _first_cells(page: pathlib.Path) -> Iterator[str]:
    """The first cell of every row of every table on ``page``, header and rule rows left out."""
    for line in page.read_text().splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cell = line.split("|")[1].strip()
        if cell in ("Key", "Metric", "Alert"):
            continue
        yield cell


def _documented_keys(page: pathlib.Path) -> set[str]:
    """The keys a configuration table names in its first column: ``a.b`` / ``c`` is ``a.b``
    and ``a.c`` (a bare name continues the table of the dotted one before it)."""
    keys: set[str] = set()
    for cell in _first_cells(page):
        table = ""
        for code in _CODE.findall(cell):
            if "." in code:
                table, _, _ = code.rpartition(".")
                keys.add(code)
            else:
                keys.add(f"{table}.{code}")
    return keys


def _exported_metrics() -> set[str]:
    """Every family ``/metrics`` exports, by its exposed name (counters with ``_total``)."""
    registry = CollectorRegistry()
    GatewayMetrics(registry, cluster=True)
    text = generate_latest(registry).decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def test_configuration_page_documents_every_config_key_and_no_other() -> None:
    documented = _documented_keys(DOCS / "configuration.md")
    expected = set(_config_keys(GatewayConfig))

    assert sorted(expected - documented) == [], "config keys missing from docs/configuration.md"
    assert sorted(documented - expected) == [], "docs/configuration.md names keys the config does not have"


def test_metrics_page_documents_every_exported_metric_and_no_other() -> None:
    documented = {
        code for cell in _first_cells(DOCS / "metrics.md") for code in _CODE.findall(cell) if code.startswith("mcp_")
    }
    exported = _exported_metrics()

    assert sorted(exported - documented) == [], "metrics missing from docs/metrics.md"
    assert sorted(documented - exported) == [], "docs/metrics.md names metrics the gateway does not export"


def test_metrics_page_documents_every_shipped_alert_and_no_other() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    shipped = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    documented = {
        code
        for cell in _first_cells(DOCS / "metrics.md")
        for code in _CODE.findall(cell)
        if code.startswith("MCPGateway")
    }

    assert shipped, "no alert found in deploy/prometheus/alerts.yml"
    assert sorted(shipped - documented) == [], "alerts missing from docs/metrics.md"
    assert sorted(documented - shipped) == [], "docs/metrics.md names alerts deploy/ does not ship"


def test_readme_stays_short_and_keeps_both_make_commands() -> None:
    text = README.read_text()

    assert len(text.splitlines()) <= README_MAX_LINES
    # .ci/run and the CI hook rely on these two commands being the README's.
    assert re.search(r"^make demo\b", text, re.M)
    assert re.search(r"^make test\b", text, re.M)


def test_readme_links_every_docs_page_by_a_relative_path_that_exists() -> None:
    text = README.read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {f"docs/{page}" for entry in nav for page in entry.values()}

    assert [t for t in targets if not (ROOT / t).exists()] == [], "README links to files that do not exist"
    assert sorted(pages - set(targets)) == [], "README does not link these docs pages"
