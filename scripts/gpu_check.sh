#!/usr/bin/env bash
# The one check of a GPU machine (see mimo/bench/gpu_check.py): the Triton kernel and device-
# preprocessing tests compiled on the device, the tiny models on the device against the torch
# backend, then a short speed run (decode at 1 and 64 streams, a 16K-token prefill, decode
# graphs on and off). The last line of stdout is one JSON object.
#
# Installs nothing from the network. It runs the python that holds torch ($PYTHON, else
# python3) on this working tree; wheels carried in .whl/ (if any: a package that machine
# lacks) are installed offline (--no-index) into a scratch directory first. The tests that
# build their reference models in transformers need the test extra's transformers (MiMo-V2-
# Flash's classes); where the machine's is older, carry that wheel too, or read those tests'
# failures in the JSON line's kernels.failed_tests for what they are.
#
#   scripts/gpu_check.sh [--phases kernels,model,speed] [--streams 1,64] [--prefill-tokens N] ...
#   scripts/gpu_check.sh --help
# Exit status: 0 all passed, 1 a phase failed, 2 bad arguments or no CUDA device, 3 the
# carried wheels did not install.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
PY="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
    site="${TMPDIR:-/tmp}/mimo-gpu-check-site"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .whl/*.whl >&2; then
        echo '{"ok": false, "errors": ["the wheels carried in .whl/ did not install"]}'
        exit 3
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 MIMO_COMPILE=off TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
exec "$PY" -m mimo.bench.gpu_check "$@"
