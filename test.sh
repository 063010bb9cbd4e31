#!/usr/bin/env bash
# Run the test suite; sets up the environment (with test dependencies) on first use.
cd "$(dirname "$0")"
MIMO_EXTRAS=test . scripts/env.sh
# Engines built by tests run eagerly unless a test asks for compile="on" itself, whatever
# the caller's $MIMO_COMPILE: compiling costs tens of seconds per process (see --compile).
export MIMO_COMPILE="${MIMO_COMPILE:-off}"
# Build the CPU kernels once, for every instruction set this CPU runs (cached per build and
# torch version: a second run only loads them); the kernel tests run each build and the
# plain PyTorch fallback. A failed build logs one line and the tests fail where they need it.
python -m mimo.cpu.build || true
exec python -m pytest -q "$@"
