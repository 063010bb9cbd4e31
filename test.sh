#!/usr/bin/env bash
# Run the test suite; sets up the environment (with test dependencies) on first use.
cd "$(dirname "$0")"
MIMO_EXTRAS=test . scripts/env.sh
exec python -m pytest -q "$@"
