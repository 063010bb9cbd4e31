#!/usr/bin/env bash
# Run the test suite; sets up the environment (with test dependencies) on first use.
cd "$(dirname "$0")"
MIMO_EXTRAS=test . scripts/env.sh
# Engines built by tests run eagerly unless a test asks for compile="on" itself, whatever
# the caller's $MIMO_COMPILE: compiling costs tens of seconds per process (see --compile).
export MIMO_COMPILE="${MIMO_COMPILE:-off}"
exec python -m pytest -q "$@"
