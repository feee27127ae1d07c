#!/usr/bin/env bash
# Runs Warren's fuzz targets (fuzz/, libFuzzer through cargo-fuzz, no sanitizer so stable Rust
# builds them) for SECONDS each (default 60), one after another, growing fuzz/corpus/<target>/.
# Stops at the first crash and prints the crashing input (fuzz/artifacts/<target>/). With no
# TARGET, runs them all. CI does not run this; it replays the committed corpora as ordinary
# tests (crates/fuzz/tests/corpus.rs). Minimise a grown corpus before committing it:
#   (cd fuzz && cargo fuzz cmin -s none <target> corpus/<target>)
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
if ! cargo fuzz --version 2>/dev/null | grep -q '0.13.2'; then
  cargo install --locked cargo-fuzz@0.13.2
fi
cd "$root/fuzz"
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi
# One build for every target (they share the library); `cargo fuzz run` then finds them built.
cargo fuzz build -s none
log_dir="$(mktemp -d)"
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  echo "== $target: ${seconds}s" >&2
  log="$log_dir/$target.log"
  set +e
  cargo fuzz run -s none "$target" "corpus/$target" -- -max_total_time="$seconds" >"$log" 2>&1
  status=$?
  set -e
  # libFuzzer's last status line: executions, coverage, corpus size.
  grep -E '^#[0-9]+' "$log" | tail -n 1 >&2 || true
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log" >&2
    echo "== $target crashed (exit $status); the input:" >&2
    artifact="$(grep -oE 'artifacts/[^ ]+' "$log" | tail -n 1 || true)"
    if [ -n "$artifact" ] && [ -f "$artifact" ]; then
      echo "fuzz/$artifact" >&2
      xxd "$artifact" | head -n 20 >&2
    fi
    exit 1
  fi
done
