# Two entry points for a fresh machine: `make run` and `make test`; each installs into .venv if needed.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test lint bench clean install console-shots

# $(call apt_optional,COMMAND,PACKAGE,WHAT IS LOST WITHOUT IT)
apt_optional = command -v $(1) >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	{ apt-get install -y -q --no-install-recommends $(2) >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $(2) >/dev/null 2>&1; }; }; } || \
	echo "note: $(2) is not installed: $(3)"

# What `make run` needs: the package and its runtime dependencies. bubblewrap (optional, installed
# where we may: root + apt) gives sessions a read-only root and boxes of their own.
$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	@$(call apt_optional,bwrap,bubblewrap,read-only roots will be refused)
	touch $(STAMP)

# What `make test` adds: the `dev` extra (pytest, mypy, ruff, playwright), qemu, which boots the
# guest in which the tests meet a real cgroup v2 hierarchy, and Debian's chromium, the browser the
# console's tests drive (Playwright's own browser download is not used), and the `ray` extra
# (optional, as qemu is) for the tests on a real two-node Ray cluster.
$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@$(call apt_optional,qemu-system-x86_64,qemu-system-x86,the cgroup v2 tests in a VM will be skipped)
	@$(call apt_optional,chromium,chromium,the console's browser tests will be skipped)
	@$(BIN)/python -m pip install -q -e '.[ray]' >/dev/null 2>&1 || \
		echo "note: the ray extra is not installed: the tests on a two-node Ray cluster will be skipped"
	touch $(DEV_STAMP)

install: $(DEV_STAMP)

# `make run`: the daemon with an embedded default configuration (written once to $(RUN_DIR), then
# yours to edit). Loopback only, no tokens: every caller is agent "default"; add [server.tokens] to
# give each agent its own scope. The state directory is the default one (so the CLI of any shell
# finds the daemon) unless PROCPILOT_STATE_DIR says otherwise; the workspace is WORKSPACE, else
# PROCPILOT_WORKSPACE, else this checkout.
RUN_DIR := $(VENV)/procpilot-run
define DEFAULT_CONFIG
# procpilot serve, as `make run` starts it. Paths are relative to this file. state_dir and
# workspace_root are not set here, so that PROCPILOT_STATE_DIR / PROCPILOT_WORKSPACE apply.

[server]
host = "127.0.0.1"
port = 8765
unix_socket = "procpilot.sock"

# One bearer token per agent; the token decides the agent's scope. Required off the loopback.
# [server.tokens]
# "a-long-random-secret" = "my-agent"

# Agents that do not trust each other: each in a box of its own (needs bubblewrap), so no command
# of one can see, signal or read the logs of another's sessions, nor move this file or the socket
# (the directories above them are pinned in the box). The workspace is the checkout unless
# WORKSPACE says otherwise: give such agents another one, or they can edit the daemon's code.
# See docs/security.md.
# [policy.default]
# isolate = true
endef
export DEFAULT_CONFIG

run: $(STAMP)
	@mkdir -p $(RUN_DIR)
	@test -f $(RUN_DIR)/procpilot.toml || printf '%s\n' "$$DEFAULT_CONFIG" > $(RUN_DIR)/procpilot.toml
	$(BIN)/procpilot serve --config $(RUN_DIR)/procpilot.toml --port $${PORT:-8765} \
		--workspace "$${WORKSPACE:-$${PROCPILOT_WORKSPACE:-$(CURDIR)}}"

# One worker more than this machine's two cores: most tests wait on processes, daemons and their
# timers rather than compute (a run at -n 2 kept the cores 77% busy), and three workers took the
# suite from 9 min 34 s to 7 min 48 s - 8 min 9 s on clean clones (all passed).
# TEST_WORKERS=auto: one a core.
TEST_WORKERS ?= 3

test: $(DEV_STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15

# The console's screenshots in docs/images/, made afresh by its browser tests (a plain test run
# writes them to a temporary directory instead).
console-shots: $(DEV_STAMP)
	PROCPILOT_REFRESH_SHOTS=1 $(BIN)/python -m pytest -q tests/transports/test_console.py

bench: $(DEV_STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
