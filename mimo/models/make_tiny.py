"""Write a tiny random-weight Hugging Face checkpoint of an architecture:

    python -m mimo.models.make_tiny ARCH DIR [--seed N]

The directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a
chat template, generation_config.json) loads in transformers and is served by
`mimo.LLM(DIR)` or `python server.py --model DIR`. Architectures are the modules of
`mimo.models.tiny`, found by name: adding `tiny/<arch>.py` with a `write(out_dir, seed)`
function makes ARCH available here.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

from ..config import ConfigError
from . import tiny


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(tiny.__path__) if not m.name.startswith("_"))


def write(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    if arch not in available():
        raise ConfigError(f"no tiny checkpoint writer for {arch!r}; available: {', '.join(available())}")
    importlib.import_module(f"{tiny.__name__}.{arch}").write(Path(out_dir), seed)
    return Path(out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mimo.models.make_tiny",
        description="Write a tiny random-weight Hugging Face checkpoint. "
                    f"Architectures: {', '.join(available())}.")
    ap.add_argument("arch", metavar="ARCH", help=f"one of: {', '.join(available())}")
    ap.add_argument("out_dir", metavar="DIR", help="output directory (created if missing)")
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    args = ap.parse_args(argv)
    try:
        out = write(args.arch, args.out_dir, args.seed)
    except ConfigError as e:
        ap.error(str(e))
    print(f"wrote a tiny {args.arch} checkpoint to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
