"""structured: decode tokens/s with a JSON-schema grammar against without one, same model,
prompts and batch, greedy, measured side by side (alternating rounds, so drift in machine
load hits both alike).

The grammar is a JSON array of short strings with a large minItems, so it stays open for
all --max-tokens tokens: every step computes a real mask (inside strings, where most of the
vocabulary is allowed: the costly case). Reported per stream count: decode_tps (output
tokens after the first / time after the first), for each variant, and their ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

NAME = "structured"
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 10000}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="decode tokens/s with a JSON-schema grammar vs without",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--streams", default="1,16", help="comma-separated concurrent stream counts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per variant")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--speculative", default=None, choices=[None, "ngram"])
    return p


def _decode_tps(eng, prompts, params) -> float:
    seqs = [eng.add_request(p, params) for p in prompts]
    eng.step()                               # the prefill, which also samples the first token
    while any(len(s.output_ids) < 1 for s in seqs):
        eng.step()
    done0 = sum(len(s.output_ids) for s in seqs)
    t0 = time.perf_counter()
    while any(s.finish_reason is None for s in seqs):
        eng.step()
    dt = time.perf_counter() - t0
    return (sum(len(s.output_ids) for s in seqs) - done0) / dt


def run(args) -> int:
    from ..engine.sampling_params import SamplingParams
    from ..llm import LLM
    from ..structured import Grammar, grammar_vocab
    from .generate import _prompts
    opts = {"speculative": args.speculative} if args.speculative else {}
    llm = LLM(args.model, progress=False, dtype=args.dtype, num_threads=args.threads, **opts)
    eng = llm.engine
    vocab = grammar_vocab(llm.tokenizer, eng.model_config.vocab_size, eng.eos_ids)
    grammar = Grammar.json_schema(SCHEMA, vocab, "bench")
    out = []
    for n in (int(x) for x in args.streams.split(",")):
        prompts = _prompts(llm.tokenizer, n, 64)
        plain = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
        constrained = SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                     ignore_eos=True, constraint=grammar)
        _decode_tps(eng, prompts, plain)      # warm-up (kernels, the prefix cache)
        tps: dict[str, list[float]] = {"plain": [], "grammar": []}
        for _ in range(args.rounds):
            tps["plain"].append(_decode_tps(eng, prompts, plain))
            tps["grammar"].append(_decode_tps(eng, prompts, constrained))
        row = {"streams": n, "plain_tps": max(tps["plain"]), "grammar_tps": max(tps["grammar"])}
        row["ratio"] = row["grammar_tps"] / row["plain_tps"]
        print(f"[{NAME}] {row}", file=sys.stderr, flush=True)
        out.append(row)
    print(json.dumps({"bench": NAME, "model": args.model, "dtype": args.dtype,
                      "speculative": args.speculative, "max_tokens": args.max_tokens,
                      "rows": out}))
    return 0
