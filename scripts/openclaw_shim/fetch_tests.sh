#!/usr/bin/env bash
# Fetches OpenClaw's exec/process test files, at the commits the measured run used, into DIR
# (outside this repository: their code is OpenClaw's, under its licence, and is not ours to copy).
# Usage: fetch_tests.sh DIR
set -euo pipefail
dir=$1
while read -r commit file; do
  mkdir -p "$dir/$(dirname "$file")"
  curl -fsSL "https://raw.githubusercontent.com/openclaw/openclaw/$commit/$file" -o "$dir/$file"
done <<'LIST'
999fa64d149156e7fefe34b5206a15a1212d4916 src/agents/bash-tools.test.ts
0048c28469e00e9bded84ee1a999260cd619ea56 src/agents/bash-tools.exec.script-preflight.test.ts
01fa0711ea449b50419f293f3adaaed475bb584c src/agents/bash-tools.exec.path.test.ts
51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.process.send-keys.test.ts
c27cc4d17d60a768517a6ab297d08d7c37341130 src/agents/bash-tools.exec.pty.test.ts
51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.exec.background-abort.test.ts
51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.exec.pty-cleanup.test.ts
51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.exec.pty-fallback.test.ts
51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.exec.pty-fallback-failure.test.ts
51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.process.poll-timeout.test.ts
51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.process.supervisor.test.ts
LIST
# Counted in the measured set but not fetched or run: its 19 tests drive OpenClaw's gateway
# approval flow with the gateway mocked, and it imports OpenClaw's config and approval modules.
#   51faf41146b4a9f2603e8c73e7a9c814efa1910a src/agents/bash-tools.exec.approval-id.test.ts
