#!/usr/bin/env bash
# Creates (once) the Python environment the interoperability tests use: the OpenSandbox SDK, the
# Agent Client Protocol SDK, the MCP SDK, the E2B SDK, schemathesis (the OpenAPI fuzz tests), openapi-spec-validator (both OpenAPI documents), moto (the S3 endpoint of the scale-out tests) and Playwright (the console's browser
# tests; it drives Debian's chromium, no browser is downloaded), pinned. Prints the venv's python
# path on stdout.
# Safe to call concurrently: creation is serialised with flock and done in a temp dir + rename.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${WARREN_PYENV:-$root/target/warren-pyenv}"
stamp="$venv/.warren-ready-v7"
if [ ! -f "$stamp" ]; then
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if [ ! -f "$stamp" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "opensandbox==1.1.1" "agent-client-protocol==0.12.1" "mcp==2.3.0" "e2b==2.63.0" \
      "playwright==1.65.2" "schemathesis==4.32.5" "moto[server]==5.2.1" "openapi-spec-validator==0.9.0" >&2
    touch "$stamp"
  fi
fi
echo "$venv/bin/python"
