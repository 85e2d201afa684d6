#!/usr/bin/env bash
# Install what `make bench` needs beyond the Python venv:
#  1. wrk, the HTTP load generator (Debian package `wrk`), when it is not on PATH;
#  2. optionally py-spy (for bench/profile_gateway.py) into .venv: set BENCH_PY_SPY=0 to skip it.
# Idempotent: does nothing when the tools are already there. apt-get needs root (or sudo).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"

if ! command -v wrk >/dev/null 2>&1; then
    sudo=""
    if [[ "$(id -u)" != 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo="sudo"
        else
            echo "install-bench-tools: wrk is missing and this is not root: run 'apt-get install -y wrk' as root" >&2
            exit 1
        fi
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
{ wrk --version 2>&1 || true; } | grep -q '^wrk' || { echo "install-bench-tools: wrk does not run" >&2; exit 1; }

if [[ "${BENCH_PY_SPY:-1}" != 0 && -x "$venv/bin/pip" && ! -x "$venv/bin/py-spy" ]]; then
    "$venv/bin/pip" install -q --disable-pip-version-check py-spy >/dev/null \
        || echo "install-bench-tools: py-spy not installed (only bench/profile_gateway.py needs it)" >&2
fi
