#!/usr/bin/env bash
# Installs (once) the real ACP agents the gateway tests run, pinned by tests/agents/package-lock.json:
# @zed-industries/claude-agent-acp, @zed-industries/codex-acp, @google/gemini-cli.
# Prints the directory holding their launchers (…/node_modules/.bin) on stdout; npm's output goes
# to stderr. Safe to call concurrently: installation is serialised with flock and done in a temp
# dir + rename. The stamp records a hash of the lock file, so changing the pins reinstalls.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/tests/agents"
dir="${WARREN_AGENTS_DIR:-$root/target/warren-agents}"
hash="$(sha256sum "$src/package-lock.json" | cut -c1-16)"
stamp="$dir/.warren-ready-$hash"
if [ ! -f "$stamp" ]; then
  mkdir -p "$(dirname "$dir")"
  exec 9>"$dir.lock"
  flock 9
  if [ ! -f "$stamp" ]; then
    tmp="$dir.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    cp "$src/package.json" "$src/package-lock.json" "$tmp/"
    (cd "$tmp" && npm ci --no-audit --no-fund --loglevel=error) >&2
    touch "$tmp/.warren-ready-$hash"
    rm -rf "$dir"
    mv "$tmp" "$dir"
  fi
fi
echo "$dir/node_modules/.bin"
