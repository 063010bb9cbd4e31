#!/usr/bin/env bash
# Serve an instruction-tuned chat model, SmolLM2-135M-Instruct, on http://127.0.0.1:8000
# (OpenAI API, and a chat page at /); sets itself up on first use. Flags go to server.py
# (bash serve.sh --help); a later --model wins, e.g. the hybrid-SWA base model Gemma 3 270M:
#   bash serve.sh --model gemma-3-270m
# Why this default: docs/first_chat.md. (python server.py alone serves gemma-3-270m.)
cd "$(dirname "$0")"
. scripts/env.sh
exec python server.py --model smollm2-135m-instruct "$@"
