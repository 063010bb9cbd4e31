#!/usr/bin/env bash
# Serve the embedded default model (Gemma 3 270M) on http://127.0.0.1:8000 (OpenAI API);
# sets itself up on first use. Flags go to server.py (bash serve.sh --help).
cd "$(dirname "$0")"
. scripts/env.sh
exec python server.py "$@"
