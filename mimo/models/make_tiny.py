"""Write a tiny random-weight Hugging Face checkpoint of an architecture:

    python -m mimo.models.make_tiny ARCH DIR [--seed N]

The directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a
chat template, generation_config.json) loads in transformers and is served by
`mimo.LLM(DIR)` or `python server.py --model DIR`. ARCH is any family whose `ARCHITECTURE`
names a tiny writer (`tiny=`, a `write(out_dir, seed)` function, by convention in
`mimo.models.tiny.<arch>`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import ConfigError
from . import families


def available() -> list[str]:
    return sorted(a.name for a in families.architectures().values() if a.tiny is not None)


def write(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    family = families.by_name(arch)
    if family is None or family.tiny is None:
        raise ConfigError(f"no tiny checkpoint writer for {arch!r}; available: {', '.join(available())}")
    family.tiny(Path(out_dir), seed)
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
