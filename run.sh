#!/usr/bin/env bash
# Generate text with the embedded default model (Gemma 3 270M); sets itself up on first use.
#   bash run.sh "The capital of France is" [--max-tokens 64 --temperature 0 ...]
cd "$(dirname "$0")"
. scripts/env.sh
if [ $# -eq 0 ]; then set -- "The capital of France is"; fi
exec python -m mimo generate "$@"
