"""Tiny random-weight Hugging Face checkpoints, one module per architecture, named after it;
the family's `ARCHITECTURE` names the writer (`python -m mimo.models.make_tiny ARCH`).
Each module exposes

    write(out_dir: pathlib.Path, seed: int = 0) -> None

which writes config.json, model.safetensors, tokenizer.json (with the family's special
tokens), tokenizer_config.json (with a chat template) and generation_config.json: a directory
that transformers loads and `mimo.LLM(dir)` / `python server.py --model dir` serve. Modules
whose name starts with '_' are helpers, not architectures.
"""
