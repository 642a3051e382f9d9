#!/usr/bin/env bash
# Runs OpenClaw's exec/process test files (already fetched, see README.md) against a fresh
# `procpilot serve --profile openclaw` on a private state directory, then stops it.
# Usage: run.sh TESTS_DIR VITEST_DIR [vitest args...]
#   TESTS_DIR   holds src/agents/*.test.ts (fetch_tests.sh writes it); outside this repository
#   VITEST_DIR  a directory where `npm install vitest@3` was run (its node_modules is used)
set -euo pipefail
tests=$(cd "$1" && pwd); vitest=$(cd "$2" && pwd); shift 2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/openclaw-shim-daemon.XXXXXX")
port=${PROCPILOT_SHIM_PORT:-8799}
main=tok-shim-main-$RANDOM$RANDOM; alpha=tok-shim-alpha-$RANDOM$RANDOM; beta=tok-shim-beta-$RANDOM$RANDOM
cat > "$work/procpilot.toml" <<TOML
state_dir = "state"
workspace_root = "${TMPDIR:-/tmp}"  # the tests' temp dirs are their workdirs
[tools.exec]
profile = "openclaw"
[server]
host = "127.0.0.1"
port = $port
[server.tokens]
"$main" = "main"
"$alpha" = "alpha"
"$beta" = "beta"
TOML
(cd "$work" && exec "${PROCPILOT:-procpilot}" serve --config procpilot.toml > daemon.log 2>&1) &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; [ -n "${PROCPILOT_SHIM_KEEP:-}" ] || rm -rf "$work"' EXIT
for _ in $(seq 1 100); do grep -q "daemon on http" "$work/daemon.log" 2>/dev/null && break; sleep 0.1; done
ln -sfn "$vitest/node_modules" "$tests/node_modules"  # the test files import "vitest"
cd "$vitest"
OPENCLAW_TESTS="$tests" OPENCLAW_TEST_CAN_PTY=1 PROCPILOT_URL="http://127.0.0.1:$port" PROCPILOT_TOKEN="$main" \
  PROCPILOT_SHIM_SCOPES="{\"agent:alpha\":\"$alpha\",\"agent:beta\":\"$beta\"}" \
  npx vitest run --config "$here/vitest.config.mjs" "$@"
