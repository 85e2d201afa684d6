#!/usr/bin/env bash
# Validates everything under deploy/ without a cluster, a Docker engine or
# network access beyond the package registries (used only to install tools).
#
#   scripts/check-deploy.sh                  install missing tools, run all checks
#   scripts/check-deploy.sh install          only install the tools
#   scripts/check-deploy.sh --no-install STEP...   run some checks, never install
#
# Steps: docker yaml prometheus grafana manifests config (default: all).
#
# Tools:
#   promtool             Debian package `prometheus` (apt-get, needs root or sudo);
#                        or set PROMTOOL=/path/to/promtool
#   kubernetes-validate, yamllint, hadolint
#                        pinned in deploy/tools/requirements.txt, installed into
#                        $DEPLOY_TOOLS_DIR/venv
#   @kubernetes-models/prometheus-operator
#                        pinned in deploy/tools/package-lock.json, installed
#                        with `npm ci` into $DEPLOY_TOOLS_DIR/node (needs node)
# DEPLOY_TOOLS_DIR defaults to .tools/deploy in this checkout (about 210 MB;
# `make clean` removes it with the rest of .tools/).
# All validation runs offline once the tools are installed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPLOY="$ROOT/deploy"
TOOLS_SRC="$DEPLOY/tools"
TOOLS_DIR="${DEPLOY_TOOLS_DIR:-$ROOT/.tools/deploy}"
VENV="$TOOLS_DIR/venv"
NODE_DIR="$TOOLS_DIR/node"
PYTHON="${PYTHON:-python3}"
ALL_STEPS=(docker yaml prometheus grafana manifests config)

INSTALL=1
STEPS=()
for arg in "$@"; do
  case "$arg" in
    --no-install) INSTALL=0 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    install|all|docker|yaml|prometheus|grafana|manifests|config) STEPS+=("$arg") ;;
    *) echo "check-deploy: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
[ ${#STEPS[@]} -eq 0 ] && STEPS=(all)

log() { printf '%s\n' "$*"; }
err() { printf 'ERROR %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else err "need root (or sudo) to run: $*"; return 1
  fi
}

sha() { sha256sum "$@" | sha256sum | cut -c1-16; }

# ------------------------------------------------------------------ tools
promtool_path() {
  if [ -n "${PROMTOOL:-}" ]; then printf '%s\n' "$PROMTOOL"; return 0; fi
  command -v promtool
}

install_promtool() {
  promtool_path >/dev/null 2>&1 && return 0
  log "installing promtool (Debian package prometheus, ~19 MB download)"
  # --no-install-recommends skips prometheus-node-exporter. Nothing here uses
  # the Prometheus server itself; in containers policy-rc.d keeps it stopped.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends prometheus >/dev/null || return 1
  promtool_path >/dev/null
}

install_pytools() {
  local stamp="$VENV/.requirements.sha" want
  want="$(sha "$TOOLS_SRC/requirements.txt")"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
  log "installing Python validators into $VENV"
  rm -rf "$VENV"
  mkdir -p "$TOOLS_DIR"
  "$PYTHON" -m venv "$VENV" &&
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$TOOLS_SRC/requirements.txt" &&
    printf '%s\n' "$want" >"$stamp"
}

install_nodetools() {
  local stamp="$NODE_DIR/.lock.sha" want
  want="$(sha "$TOOLS_SRC/package.json" "$TOOLS_SRC/package-lock.json")"
  if [ -d "$NODE_DIR/node_modules" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
  if ! command -v npm >/dev/null 2>&1; then
    log "installing node and npm (Debian packages)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null || return 1
  fi
  log "installing CRD schemas (npm ci) into $NODE_DIR"
  rm -rf "$NODE_DIR"
  mkdir -p "$NODE_DIR"
  cp "$TOOLS_SRC/package.json" "$TOOLS_SRC/package-lock.json" "$NODE_DIR/" &&
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null) &&
    printf '%s\n' "$want" >"$stamp"
}

install_all() {
  local rc=0
  install_promtool || { err "could not install promtool"; rc=1; }
  install_pytools || { err "could not install the Python validators"; rc=1; }
  install_nodetools || { err "could not install the CRD schemas (npm)"; rc=1; }
  return $rc
}

need_promtool() {
  PT="$(promtool_path 2>/dev/null)" && return 0
  err "promtool not found: run scripts/check-deploy.sh install (apt-get install prometheus)"
  return 1
}
need_venv() {
  [ -x "$VENV/bin/python" ] && return 0
  err "validators not installed in $VENV: run scripts/check-deploy.sh install"
  return 1
}

# ------------------------------------------------------------------ checks
step_docker() {
  local f="$DEPLOY/Dockerfile" rc=0 user df
  [ -f "$f" ] || { err "missing $f"; return 1; }
  # instructions with their `\` line continuations joined
  df="$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$f")"
  grep -Eq '^(ARG PYTHON_IMAGE=|FROM )python:3\.11-slim' <<<"$df" ||
    { err "Dockerfile: base image is not python:3.11-slim"; rc=1; }
  # the last USER instruction decides who the container runs as
  user="$(grep -E '^USER[[:space:]]' <<<"$df" | tail -n1 | awk '{print $2}')"
  case "${user%%:*}" in
    "") err "Dockerfile: no USER instruction (would run as root)"; rc=1 ;;
    root|0) err "Dockerfile: USER is root"; rc=1 ;;
    *) log "Dockerfile: runs as USER $user" ;;
  esac
  grep -Eq '^EXPOSE[[:space:]]+8080' <<<"$df" || { err "Dockerfile: no EXPOSE 8080"; rc=1; }
  grep -q 'MCP_GATEWAY_CONFIG=/etc/mcp-gateway/config.toml' <<<"$df" ||
    { err "Dockerfile: MCP_GATEWAY_CONFIG is not /etc/mcp-gateway/config.toml"; rc=1; }
  grep -Eq '^HEALTHCHECK .*/healthz' <<<"$df" || { err "Dockerfile: no HEALTHCHECK on /healthz"; rc=1; }
  grep -Eiq '^HEALTHCHECK .*(curl|wget)' <<<"$df" && { err "Dockerfile: HEALTHCHECK must not need curl/wget"; rc=1; }
  if need_venv; then
    log "hadolint: $("$VENV/bin/hadolint" --version)"
    "$VENV/bin/hadolint" --no-color --failure-threshold warning "$f" || { err "hadolint reported problems"; rc=1; }
  else
    rc=1
  fi
  return $rc
}

step_yaml() {
  need_venv || return 1
  local files
  mapfile -t files < <(find "$DEPLOY" -path "$DEPLOY/tools" -prune -o \( -name '*.yml' -o -name '*.yaml' \) -print | sort)
  "$VENV/bin/yamllint" --strict -c "$TOOLS_SRC/yamllint.yaml" "${files[@]}" &&
    log "yamllint: ${#files[@]} files ok"
}

step_prometheus() {
  need_promtool || return 1
  local rc=0
  log "promtool: $("$PT" --version 2>&1 | head -n1)"
  (cd "$DEPLOY/prometheus" &&
    "$PT" check config prometheus.yml &&
    "$PT" check rules alerts.yml &&
    "$PT" test rules alerts_test.yml) || rc=1
  return $rc
}

step_grafana() {
  need_promtool || return 1
  "$PYTHON" "$TOOLS_SRC/check_dashboard.py" --promtool "$PT" "$DEPLOY/grafana/mcp-gateway.json"
}

step_manifests() {
  need_venv || return 1
  local node_args=()
  if [ -d "$NODE_DIR/node_modules" ] && command -v node >/dev/null 2>&1; then
    node_args=(--node-modules "$NODE_DIR/node_modules")
  else
    err "CRD schemas not installed in $NODE_DIR (or no node): run scripts/check-deploy.sh install"
  fi
  "$VENV/bin/python" "$TOOLS_SRC/validate_manifests.py" "${node_args[@]}" "$DEPLOY/kubernetes"
}

step_config() {
  # Only when the gateway is installed (pip install .): its own config check.
  if ! command -v mcp-gateway >/dev/null 2>&1; then
    log "SKIP config: mcp-gateway is not installed (pip install . first)"
    return 0
  fi
  GATEWAY_TOKEN="${GATEWAY_TOKEN:-check-deploy-token}" \
  GATEWAY_ADMIN_TOKEN="${GATEWAY_ADMIN_TOKEN:-check-deploy-admin-token}" \
  GATEWAY_METRICS_TOKEN="${GATEWAY_METRICS_TOKEN:-check-deploy-metrics-token}" \
  WEATHER_TOKEN="${WEATHER_TOKEN:-check-deploy-weather-token}" \
    mcp-gateway check-config "$DEPLOY/config.example.toml"
}

# ------------------------------------------------------------------ main
run_steps=()
for s in "${STEPS[@]}"; do
  case "$s" in
    all) run_steps+=("${ALL_STEPS[@]}") ;;
    install) ;;
    *) run_steps+=("$s") ;;
  esac
done

if [ "$INSTALL" -eq 1 ]; then
  install_all || { log "check-deploy: FAILED (tool installation)"; exit 1; }
fi

failed=()
for s in "${run_steps[@]}"; do
  log "== $s"
  if "step_$s"; then log "-- $s: ok"; else log "-- $s: FAILED"; failed+=("$s"); fi
done

if [ ${#run_steps[@]} -eq 0 ]; then
  log "check-deploy: tools installed in $TOOLS_DIR"
elif [ ${#failed[@]} -eq 0 ]; then
  log "check-deploy: OK (${run_steps[*]})"
else
  log "check-deploy: FAILED (${failed[*]})"
  exit 1
fi
