#!/usr/bin/env bash
# Everything the tests need, then every test: the README's test command and the last step of
# .ci/run. On Debian (as root, or with sudo): bubblewrap for the hands sandbox, chromium for the
# console's browser tests, PostgreSQL's server binaries for the scale-out tests (the tests run
# initdb into temporary directories themselves and need no system service); then the pinned
# Python SDKs and the real agents, into target/. The network tests' tools (curl, git, npm,
# pip) run inside the hands. Each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
[ -x /usr/bin/chromium ] || missing+=(chromium)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
# Tools the network tests run inside the hands, through the egress proxy.
command -v curl >/dev/null || missing+=(curl)
command -v git >/dev/null || missing+=(git)
command -v npm >/dev/null || missing+=(npm)
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "installing ${missing[*]} (apt-get)" >&2
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
bash scripts/python-env.sh >/dev/null
bash scripts/agents-env.sh >/dev/null
exec cargo test --workspace --all-targets --locked "$@"
