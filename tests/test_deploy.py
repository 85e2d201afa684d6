"""Checks for the deployment artefacts under deploy/.

promtool (Debian package `prometheus`) and the validators installed by
`scripts/check-deploy.sh install` are required: when they are missing these
tests FAIL on purpose instead of skipping. Needs PyYAML.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import tomllib

import aiohttp
import pytest
import yaml

from .support.fleet import Upstream
from .support.polling import wait_until
from .support.reloading import gateway, public, served_sha
from .support.replicas import dump_toml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "mcp-gateway.json"
CHECK_DEPLOY = ROOT / "scripts" / "check-deploy.sh"
CONFIG_PATH = "/etc/mcp-gateway/config.toml"

# Metrics the gateway exports (histograms add _bucket/_sum/_count).
KNOWN_METRICS = {
    "mcp_gateway_requests_total",
    "mcp_gateway_request_duration_seconds",
    "mcp_gateway_cache_lookups_total",
    "mcp_gateway_cache_stores_total",
    "mcp_gateway_cache_refreshes_total",
    "mcp_gateway_aggregate_parts_missing_total",
    "mcp_gateway_cache_evictions_total",
    "mcp_gateway_cache_entries",
    "mcp_gateway_cache_bytes",
    "mcp_gateway_upstream_request_duration_seconds",
    "mcp_gateway_upstream_up",
    "mcp_gateway_upstream_supported_version",
    "mcp_gateway_inflight_requests",
    # with [cluster]
    "mcp_gateway_cluster_up",
    "mcp_gateway_cluster_errors_total",
    "mcp_gateway_cluster_reads_total",
    "mcp_gateway_cluster_leases_held",
    "mcp_gateway_cluster_invalidations_pending",
    "mcp_gateway_listener_callers_dropped_total",
    "mcp_gateway_auth_total",
    "mcp_gateway_config_info",
    "mcp_gateway_config_reloads_total",
}
REQUIRED_ALERTS = {
    "MCPGatewayUpstreamDown",
    "MCPGatewayHighErrorRate",
    "MCPGatewayCacheHitRatioCollapse",
    "MCPGatewayHighP99Latency",
    "MCPGatewaySharedTierDown",
    "MCPGatewaySharedTierErrors",
    "MCPGatewayInvalidationsPending",
    "MCPGatewaySharedTierForgedValues",
    "MCPGatewayServingStale",
    "MCPGatewayConfigReloadFailed",
    "MCPGatewayConfigDrift",
    "MCPGatewayAuthFailureBurst",
}


# ---------------------------------------------------------------- helpers
def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def load_yaml(path: pathlib.Path) -> list[dict]:
    with path.open() as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def one(path: pathlib.Path) -> dict:
    docs = load_yaml(path)
    assert len(docs) == 1, f"{path.name}: expected one document"
    return docs[0]


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # join line continuations
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def promtool_path() -> str:
    """promtool, or a test failure (never a skip) when it is missing."""
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path:
        pytest.fail(
            "promtool is not installed: run `scripts/check-deploy.sh install` "
            "(or apt-get install -y --no-install-recommends prometheus)"
        )
    return path


@pytest.fixture(scope="session")
def deployment() -> dict:
    return one(K8S / "deployment.yaml")


@pytest.fixture(scope="session")
def container(deployment) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.fixture(scope="session")
def config_toml() -> str:
    cm = one(K8S / "configmap.yaml")
    return cm["data"]["config.toml"]


# ------------------------------------------------------- promtool checks
def test_promtool_check_config():
    promtool = promtool_path()
    proc = run([promtool, "check", "config", "prometheus.yml"], cwd=PROM)
    assert proc.returncode == 0, output(proc)
    assert "1 rule files found" in proc.stdout, output(proc)


def test_promtool_check_rules():
    promtool = promtool_path()
    proc = run([promtool, "check", "rules", "alerts.yml"], cwd=PROM)
    assert proc.returncode == 0, output(proc)


def test_promtool_test_rules():
    promtool = promtool_path()
    proc = run([promtool, "test", "rules", "alerts_test.yml"], cwd=PROM)
    assert proc.returncode == 0, output(proc)
    assert "SUCCESS" in proc.stdout, output(proc)


def test_promtool_test_rules_fails_on_broken_alert(tmp_path):
    """The unit tests have teeth: raising a threshold must make them fail."""
    promtool = promtool_path()
    rules = (PROM / "alerts.yml").read_text()
    assert ") > 0.05" in rules
    (tmp_path / "alerts.yml").write_text(rules.replace(") > 0.05", ") > 0.5"))
    shutil.copy(PROM / "alerts_test.yml", tmp_path / "alerts_test.yml")
    proc = run([promtool, "test", "rules", "alerts_test.yml"], cwd=tmp_path)
    assert proc.returncode != 0, output(proc)
    assert "MCPGatewayHighErrorRate" in proc.stdout + proc.stderr


# --------------------------------------------------------- alert rules
def all_rules() -> list[dict]:
    doc = one(PROM / "alerts.yml")
    return [r for g in doc["groups"] for r in g["rules"]]


def test_alerts_have_severity_and_annotations():
    alerts = {r["alert"]: r for r in all_rules() if "alert" in r}
    assert REQUIRED_ALERTS <= alerts.keys()
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"].get("summary"), name
        assert rule["annotations"].get("description"), name
        assert rule.get("for"), f"{name}: no `for`, it would fire on one bad scrape"


def test_every_alert_is_tested_firing_and_silent():
    tests = one(PROM / "alerts_test.yml")["tests"]
    fired, silent = set(), set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {r["alert"] for r in all_rules() if "alert" in r}
    assert names <= fired, f"never made to fire: {names - fired}"
    assert names <= silent, f"never checked to stay silent: {names - silent}"


def test_prometheus_scrape_config():
    cfg = one(PROM / "prometheus.yml")
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    job = jobs["mcp-gateway"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["127.0.0.1:8080"]
    for rf in cfg["rule_files"]:
        assert not os.path.isabs(rf)
        assert (PROM / rf).is_file(), rf


def metric_names(text: str) -> set[str]:
    names = set(re.findall(r"\bmcp_gateway_[a-z_]+\b", text))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_alerts_and_dashboard_only_use_exported_metrics():
    used = metric_names((PROM / "alerts.yml").read_text())
    used |= metric_names((PROM / "alerts_test.yml").read_text())
    used |= metric_names(DASHBOARD.read_text())
    assert used, "no metrics found"
    assert used <= KNOWN_METRICS, f"unknown metrics: {sorted(used - KNOWN_METRICS)}"


def test_known_metrics_are_what_the_gateway_exports():
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.telemetry import GatewayMetrics

    registry = CollectorRegistry()
    GatewayMetrics(registry, cluster=True)
    exported = set(re.findall(r"^# TYPE (\S+) ", generate_latest(registry).decode(), re.M))
    assert exported == KNOWN_METRICS


def test_hit_ratios_count_hits_from_the_shared_tier():
    """A lookup answered from Redis (result="shared") is a hit wherever a hit ratio is computed."""
    texts = {"alerts.yml": (PROM / "alerts.yml").read_text(), "dashboard": DASHBOARD.read_text()}
    for name, text in texts.items():
        results = re.findall(r'cache_lookups_total\{[^}]*result=~?\\?"([^"\\]*)', text)
        assert results, name
        for matched in results:
            if "hit" in matched.split("|"):
                assert "shared" in matched.split("|"), f"{name}: result=~{matched!r} leaves out shared hits"


# ------------------------------------------------------------- grafana
def test_dashboard_check_and_promql_parse():
    promtool = promtool_path()
    proc = run([sys.executable, str(DEPLOY / "tools" / "check_dashboard.py"), "--promtool", promtool, str(DASHBOARD)])
    assert proc.returncode == 0, output(proc)
    assert "parsed by promtool" in proc.stdout


def test_dashboard_content():
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    # what the dashboard must show
    assert 'result=~"hit|coalesced|shared"' in exprs  # hit ratio (shared: a hit from Redis)
    assert "mcp_gateway_requests_total" in exprs  # traffic
    assert "histogram_quantile(0.99" in exprs  # latency
    assert "mcp_gateway_upstream_up" in exprs  # health
    assert "mcp_gateway_cache_evictions_total" in exprs
    assert "mcp_gateway_cache_entries" in exprs and "mcp_gateway_cache_bytes" in exprs
    matrix = [p for p in panels if "mcp_gateway_upstream_supported_version" in json.dumps(p["targets"])]
    assert matrix and matrix[0]["type"] in {"table", "heatmap"}
    # traffic and latency are broken down per upstream
    assert "sum by (upstream) (rate(mcp_gateway_requests_total" in exprs
    assert "sum by (upstream, le) (rate(mcp_gateway_request_duration_seconds_bucket" in exprs
    # the shared tier ([cluster]): up per instance, reads by result, errors by operation
    assert "min by (instance) (mcp_gateway_cluster_up" in exprs
    assert "sum by (result) (rate(mcp_gateway_cluster_reads_total" in exprs
    assert "sum by (operation) (rate(mcp_gateway_cluster_errors_total" in exprs
    # serving through upstream failures: stale answers and refresh-ahead
    assert 'result="stale"' in exprs
    assert "sum by (upstream, outcome) (rate(mcp_gateway_cache_refreshes_total" in exprs
    # config reload: the configs served (replicas by sha256, each instance's) and reloads by outcome
    assert "count by (sha256) (mcp_gateway_config_info" in exprs
    assert "max by (instance, sha256) (mcp_gateway_config_info" in exprs
    assert "sum by (outcome) (increase(mcp_gateway_config_reloads_total" in exprs
    # auth: every outcome, and policy denials apart
    assert "sum by (outcome) (rate(mcp_gateway_auth_total" in exprs
    assert 'mcp_gateway_auth_total{job=~"$job", instance=~"$instance", outcome=~"denied|insufficient_scope"}' in exprs


# ---------------------------------------------- manifests and tools
def test_manifest_schema_validation():
    """Strict schema validation (kubernetes-validate) and the ServiceMonitor CRD schema."""
    proc = run([str(CHECK_DEPLOY), "--no-install", "manifests"])
    assert proc.returncode == 0, output(proc)
    assert "servicemonitor/mcp-gateway (monitoring.coreos.com/v1, bundled CRD schema)" in proc.stdout
    assert "deployment/mcp-gateway (apps/v1, Kubernetes 1.37, strict)" in proc.stdout


def test_manifest_validation_catches_unknown_field(tmp_path):
    venv_python = (
        pathlib.Path(os.environ.get("DEPLOY_TOOLS_DIR", ROOT / ".tools" / "deploy")) / "venv" / "bin" / "python"
    )
    if not venv_python.exists():
        pytest.fail(f"validators not installed ({venv_python}): run scripts/check-deploy.sh install")
    bad = (K8S / "deployment.yaml").read_text().replace("readOnlyRootFilesystem:", "readOnlyRootFileSystem:")
    (tmp_path / "deployment.yaml").write_text(bad)
    proc = run([str(venv_python), str(DEPLOY / "tools" / "validate_manifests.py"), str(tmp_path)])
    assert proc.returncode == 1, output(proc)
    assert "readOnlyRootFileSystem" in proc.stdout


def test_yamllint_and_hadolint():
    proc = run([str(CHECK_DEPLOY), "--no-install", "yaml", "docker"])
    assert proc.returncode == 0, output(proc)


# ----------------------------------------------------- structure: k8s
def test_kustomization_lists_resources_but_not_the_example_secret():
    kust = one(K8S / "kustomization.yaml")
    listed = set(kust["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert "secret.example.yaml" not in listed
    assert listed == on_disk - {"secret.example.yaml"}


def test_probes(container):
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", 8080)


def test_resources(container):
    res = container["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= res[kind].keys(), kind


def test_security_context(deployment, container):
    pod = deployment["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] != 0
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    csc = container["securityContext"]
    assert csc["runAsNonRoot"] is True
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["capabilities"]["drop"] == ["ALL"]
    assert not csc["capabilities"].get("add")
    assert csc["seccompProfile"]["type"] == "RuntimeDefault"
    assert csc.get("privileged", False) is False
    # read-only root: anything that needs a scratch dir gets /tmp
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_config_mount_and_env(deployment, container):
    env = {e["name"]: e for e in container["env"]}
    assert env["MCP_GATEWAY_CONFIG"]["value"] == CONFIG_PATH
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    cfg_mounts = [m for m in mounts.values() if volumes[m["name"]].get("configMap")]
    assert len(cfg_mounts) == 1
    mount = cfg_mounts[0]
    assert mount["readOnly"] is True
    vol = volumes[mount["name"]]["configMap"]
    assert vol["name"] == one(K8S / "configmap.yaml")["metadata"]["name"]
    paths = [i["path"] for i in vol.get("items", [])] or ["config.toml"]
    assert CONFIG_PATH in {f"{mount['mountPath']}/{p}" for p in paths}


def test_configmap_toml(config_toml, container):
    cfg = tomllib.loads(config_toml)
    assert cfg["listener"]["host"] == "0.0.0.0"
    assert cfg["listener"]["port"] == container["ports"][0]["containerPort"]
    assert cfg["upstreams"], "no upstreams configured"
    assert config_toml == (DEPLOY / "config.example.toml").read_text(), "configmap.yaml and config.example.toml differ"


def toml_strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [s for v in value for s in toml_strings(v)]
    return []


def test_every_config_variable_comes_from_a_secret(config_toml, container):
    strings = toml_strings(tomllib.loads(config_toml))
    variables = {v for s in strings for v in re.findall(r"\$\{(\w+)\}", s)}
    assert {"GATEWAY_TOKEN", "GATEWAY_ADMIN_TOKEN"} <= variables
    env = {e["name"]: e for e in container["env"]}
    secret = one(K8S / "secret.example.yaml")
    for var in variables:
        assert var in env, f"${{{var}}} is used in config.toml but not set in the Deployment"
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"], f"{ref['key']} missing from secret.example.yaml"
        assert not ref.get("optional", False)


def commented_cluster_block(config_toml: str) -> list[str]:
    """The lines of the commented-out `[cluster]` table of config.toml, uncommented."""
    lines = config_toml.splitlines()
    assert "# [cluster]" in lines, "config.toml has no commented [cluster] example"
    block = []
    for line in lines[lines.index("# [cluster]") :]:
        if not line.startswith("# "):
            break
        block.append(line[2:])
    return block


def test_cluster_example_takes_its_password_from_an_optional_secret_key(config_toml, container):
    block = commented_cluster_block(config_toml)
    cluster = tomllib.loads("\n".join(block))["cluster"]
    assert cluster["redis_url"].startswith("rediss://"), "the example should use TLS"
    variables = set(re.findall(r"\$\{(\w+)\}", cluster["redis_url"]))
    assert variables == {"REDIS_PASSWORD"}
    env = {e["name"]: e for e in container["env"]}
    secret = one(K8S / "secret.example.yaml")
    for var in variables:
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"], f"{ref['key']} missing from secret.example.yaml"
        # pods of a deployment without Redis (the block commented out) start without the key
        assert ref.get("optional") is True


def labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_service_pdb_hpa_servicemonitor_wiring(deployment, container):
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], pod_labels)

    svc = one(K8S / "service.yaml")
    assert labels_match(svc["spec"]["selector"], pod_labels)
    port_names = {p["name"] for p in container["ports"]}
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["targetPort"] in port_names | {8080}

    pdb = one(K8S / "pdb.yaml")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)

    hpa = one(K8S / "hpa.yaml")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]

    sm = one(K8S / "servicemonitor.yaml")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert labels_match(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == svc_port["name"]
    assert endpoint["path"] == "/metrics"
    # the alert rules select job="mcp-gateway"
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "mcp-gateway"


def config_reloader(deployment: dict) -> dict:
    """The ``config-reloader`` sidecar of the Deployment (a native sidecar: an init container that keeps running)."""
    (sidecar,) = [
        c for c in deployment["spec"]["template"]["spec"].get("initContainers", []) if c["name"] == "config-reloader"
    ]
    return sidecar


def test_the_config_reloader_sidecar_sees_the_gateways_config_file_and_calls_its_reload_route(deployment, container):
    sidecar = config_reloader(deployment)
    assert sidecar["restartPolicy"] == "Always"  # a sidecar: started before the gateway, runs beside it
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["MCP_GATEWAY_CONFIG"]["value"] == CONFIG_PATH
    port = container["ports"][0]["containerPort"]
    assert env["RELOAD_URL"]["value"] == f"http://127.0.0.1:{port}/admin/reload"
    gateway_env = {e["name"]: e for e in container["env"]}
    assert env["GATEWAY_ADMIN_TOKEN"]["valueFrom"] == gateway_env["GATEWAY_ADMIN_TOKEN"]["valueFrom"]
    # the same volume at the same path, and never through subPath (the kubelet does not update those)
    volume = {m["name"]: m for m in container["volumeMounts"]}["config"]
    (mount,) = [m for m in sidecar["volumeMounts"] if m["name"] == "config"]
    assert (mount["mountPath"], mount["readOnly"]) == (volume["mountPath"], True)
    assert "subPath" not in mount and "subPath" not in volume
    assert sidecar["securityContext"] == container["securityContext"]
    assert {"cpu", "memory"} <= sidecar["resources"]["limits"].keys()


def swap_config(path: pathlib.Path, config: dict) -> str:
    """``config`` (with the running file's ``[listener]`` and ``[admin]``) as ``path``, replaced in one step as the
    kubelet swaps a ConfigMap volume's files; the SHA-256 of the bytes written."""
    current = tomllib.loads(path.read_text())
    text = dump_toml({"listener": current["listener"], "admin": current["admin"], **config})
    staged = path.with_suffix(".staged")
    staged.write_text(text)
    os.replace(staged, path)
    return hashlib.sha256(text.encode()).hexdigest()


async def test_the_config_reloader_reloads_the_gateway_when_its_file_changes_and_sends_an_invalid_file_once(
    deployment, tmp_path: pathlib.Path, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    """The sidecar's own script (sh, sha256sum, curl) against a real gateway process."""
    script = config_reloader(deployment)["command"][-1]
    async with gateway(tmp_path, {"upstreams": {"a": public(public_up)}}) as gw:
        path = gw[0].config_path
        env = {
            **os.environ,
            "MCP_GATEWAY_CONFIG": str(path),
            "RELOAD_URL": f"{gw.base_url(0)}/admin/reload",
            "RELOAD_INTERVAL_S": "0.2",
            "GATEWAY_ADMIN_TOKEN": gw.admin_token,
        }
        reloader = await asyncio.create_subprocess_exec(
            "sh", "-c", script, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )

        async def reloads(outcome: str) -> float | None:
            return await gw.metric(0, "mcp_gateway_config_reloads_total", outcome=outcome)

        try:
            assert reloader.stdout is not None
            started = await asyncio.wait_for(reloader.stdout.readline(), 10)
            assert b"watching" in started, started
            two = swap_config(path, {"upstreams": {"a": public(public_up), "b": public(public_up)}})

            async def serving(sha: str) -> bool:
                return await served_sha(gw) == sha

            await wait_until(lambda: serving(two), what="the gateway to serve the file with b")
            swap_config(path, {"upstreams": {"a": {"url": "not a url"}}})
            await wait_until(lambda: reloads("failed"), what="the invalid file to be refused")
            # Not sent again while it stays: a check that something does not happen needs a
            # window; 10 of the reloader's turns.
            loop = asyncio.get_running_loop()
            window_ends = loop.time() + 10 * 0.2
            while loop.time() < window_ends:
                assert await reloads("failed") == 1
                await asyncio.sleep(0.05)
            one_again = swap_config(path, {"upstreams": {"a": public(public_up)}})
            await wait_until(lambda: serving(one_again), what="the gateway to serve the file without b")
            assert (await reloads("failed"), await reloads("ok")) == (1, 2)
        finally:
            reloader.terminate()
            output_text = (await asyncio.wait_for(reloader.communicate(), 10))[0].decode()
        assert "changed (sha256 " + two in output_text, output_text


# ------------------------------------------------- structure: Dockerfile
def test_dockerfile():
    ins = dockerfile_instructions()
    args = dict(a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)
    bases = [a.split()[0] for w, a in ins if w == "FROM"]
    bases = [args.get(b.strip("${}"), b) for b in bases]
    assert bases and all(b.startswith("python:3.11-slim") for b in bases), bases
    users = [a for w, a in ins if w == "USER"]
    assert users, "no USER: the container would run as root"
    final_user = users[-1].split(":")[0]
    assert final_user not in {"root", "0"}
    assert ("EXPOSE", "8080") in ins
    env = " ".join(a for w, a in ins if w == "ENV")
    assert f"MCP_GATEWAY_CONFIG={CONFIG_PATH}" in env
    hc = [a for w, a in ins if w == "HEALTHCHECK"]
    assert len(hc) == 1 and "/healthz" in hc[0]
    assert not re.search(r"\b(curl|wget)\b", hc[0])


def healthcheck_argv() -> list[str]:
    (hc,) = [a for w, a in dockerfile_instructions() if w == "HEALTHCHECK"]
    argv = json.loads(hc[hc.index("CMD") + 3 :].strip())
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok" if code == 200 else b"no")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, healthy", [(200, True), (503, False)])
def test_dockerfile_healthcheck_command(status, healthy):
    handler = type("H", (_Health,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
        env = {**os.environ, "MCP_GATEWAY_HEALTHCHECK_URL": url, "HTTP_PROXY": "http://127.0.0.1:9"}
        proc = run(healthcheck_argv(), env=env)
        assert (proc.returncode == 0) is healthy, output(proc)
    finally:
        server.shutdown()
        server.server_close()


def test_dockerfile_healthcheck_fails_when_nothing_listens():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    port = server.server_address[1]
    server.server_close()  # the port is now closed
    env = {**os.environ, "MCP_GATEWAY_HEALTHCHECK_URL": f"http://127.0.0.1:{port}/healthz"}
    proc = run(healthcheck_argv(), env=env)
    assert proc.returncode != 0


# ------------------------------------------------------ gateway's check
CHECK_CONFIG_ENV = {
    "GATEWAY_TOKEN": "deploy-test-gateway-token",
    "GATEWAY_ADMIN_TOKEN": "deploy-test-admin-token",
    "GATEWAY_METRICS_TOKEN": "deploy-test-metrics-token",
    "WEATHER_TOKEN": "deploy-test-weather-token",
}


def gateway_exe() -> str:
    exe = shutil.which("mcp-gateway", path=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if not exe:
        pytest.skip("mcp-gateway is not installed (pip install .)")
    return exe


def test_config_passes_gateway_check_config():
    env = {**os.environ, **CHECK_CONFIG_ENV}
    proc = run([gateway_exe(), "check-config", str(DEPLOY / "config.example.toml")], env=env)
    assert proc.returncode == 0, output(proc)


def test_config_with_the_cluster_example_uncommented_passes_gateway_check_config(tmp_path):
    text = (DEPLOY / "config.example.toml").read_text()
    block = commented_cluster_block(text)
    uncommented = text.replace("\n".join(f"# {line}" for line in block), "\n".join(block))
    assert uncommented != text
    path = tmp_path / "config.toml"
    path.write_text(uncommented)
    exe = gateway_exe()
    env = {
        **os.environ,
        **CHECK_CONFIG_ENV,
        "REDIS_PASSWORD": "0123456789abcdef0123456789abcdef",
        "MCP_GATEWAY_CLUSTER_SECRET": "fedcba9876543210fedcba9876543210",
    }
    proc = run([exe, "check-config", str(path)], env=env)
    assert proc.returncode == 0, output(proc)
    # the Secret's key is optional in the Deployment: without it the config names the variable
    env.pop("REDIS_PASSWORD")
    proc = run([exe, "check-config", str(path)], env=env)
    assert proc.returncode == 2, output(proc)
    assert "REDIS_PASSWORD" in proc.stderr
