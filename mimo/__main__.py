"""Command line: `python -m mimo generate "prompt"`."""
from __future__ import annotations

import argparse
import sys
import time

from .config import ConfigError
from .flags import add_engine_flags, engine_opts


def _generate(a: argparse.Namespace) -> int:
    from . import LLM, SamplingParams
    llm = LLM(a.model, **engine_opts(a))
    params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p,
                            top_k=a.top_k, seed=a.seed)
    eng, tok = llm.engine, llm.tokenizer
    seq = eng.add_request(tok.encode(a.prompt), params)
    printed = ""
    t0 = time.perf_counter()
    sys.stdout.write(a.prompt)
    while seq.finish_reason is None:
        eng.step()
        text = tok.decode(seq.output_ids)
        # A multi-byte character may be split across tokens: hold back a trailing U+FFFD.
        stable = text.rstrip("\ufffd") if seq.finish_reason is None else text
        if stable.startswith(printed):
            sys.stdout.write(stable[len(printed):])
            sys.stdout.flush()
            printed = stable
    dt = time.perf_counter() - t0
    sys.stdout.write("\n")
    print(f"[{len(seq.output_ids)} tokens in {dt:.2f}s, {len(seq.output_ids) / dt:.1f} tokens/s, "
          f"finish: {seq.finish_reason}]", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mimo", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate a continuation of a prompt")
    g.add_argument("prompt")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    add_engine_flags(g)
    a = p.parse_args(argv)
    try:
        return _generate(a)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
