"""`python -m mimo.cpu.build`: build (or load from the cache) the C++ kernels for every
instruction set this CPU runs, saying which and how long each took; exit 1 if one failed."""
from __future__ import annotations

import logging
import sys

from . import extension
from .features import ISAS, cpu_info


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    info = cpu_info()
    print(f"CPU: {info.summary()}", file=sys.stderr)
    failed = [isa for isa in ISAS if info.supports(isa) and extension.load(isa) is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
