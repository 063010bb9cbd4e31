"""spec: decode speed with and without speculative decoding, side by side in one process.

Workload `copy`: prompts whose answers copy large parts of the prompt (repeat a code snippet
from the standard library exactly; quote a paragraph of its documentation), where a drafter
that looks the continuation up in the prompt should shine. Both engines share the weights
and get the same prompts, greedy, exactly --max-tokens tokens each (ignore_eos); the runs
alternate (off, on, on, off, ...) for --reps repetitions so machine load hits both alike.

`--shape mimo-v2-flash-tiny` runs a random-weight tiny MiMo-V2-Flash (with MTP layers, so
`--drafter mtp` works) instead of --model: its acceptance is low (random weights); it shows
the machinery and the drafter's overhead per step.

Reported: decode tokens/s (tokens after the first / time after the first token) off and on,
the speedup (of the mean rates, and the median of the per-repetition ratios), mean
acceptance length (tokens per verify step), acceptance per draft position, mean wall time
per decode step off and on (`step_ms_*`),
`lossless` (every output token-identical with speculation on and off), and `copy_fraction`
(share of output 8-grams found in the prompt: the workload really copies). One JSON line last;
progress on stderr.
"""
from __future__ import annotations

import inspect
import json
import sys
import time

from mimo.config import QUANTIZE

NAME = "spec"
SHAPES = ("mimo-v2-flash-tiny",)


def add_parser(subparsers):
    p = subparsers.add_parser(NAME, help="decode tokens/s with vs without speculative decoding",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m", help="built-in name, .gguf file or HF dir")
    p.add_argument("--shape", default=None, choices=SHAPES,
                   help="a random-weight model of a known shape instead of --model (MTP runs)")
    p.add_argument("--drafter", default="ngram", choices=["ngram", "mtp"])
    p.add_argument("--workload", default="copy", choices=["copy"])
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=4, help="prompts per run (6 distinct ones)")
    p.add_argument("--streams", type=int, default=1, help="requests decoded concurrently")
    p.add_argument("--reps", type=int, default=2, help="alternating repetitions of each mode")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--quantize", default="auto", choices=list(QUANTIZE))
    p.add_argument("--kv-cache-memory", default="512MiB", help="KV budget of each engine")
    p.add_argument("--fused-decode", default="auto", choices=["auto", "off"],
                   help="decode layers as one C++ call each (auto) or the plain layers (off)")
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def copy_prompts(n: int) -> list[str]:
    """Prompts a base model answers by copying: code to repeat, a paragraph to quote."""
    import argparse
    import json as j
    import textwrap
    out = []
    for fn in (j.dumps, textwrap.dedent, inspect.getmodule, argparse.ArgumentParser.add_argument):
        src = inspect.getsource(fn)[:1100]
        out.append("Repeat the following code exactly.\n\nCode:\n```python\n" + src
                   + "```\n\nRepeated code:\n```python\n")
    for mod in (j, textwrap):
        para = (inspect.getdoc(mod) or "")[:900]
        out.append("Quote the following paragraph exactly.\n\nParagraph:\n\"\"\"\n" + para
                   + "\n\"\"\"\n\nQuoted paragraph:\n\"\"\"\n")
    return [out[i % len(out)] for i in range(n)]


def copy_fraction(prompt: list[int], output: list[int], n: int = 8) -> float:
    grams = {tuple(prompt[i:i + n]) for i in range(len(prompt) - n + 1)}
    outs = [tuple(output[i:i + n]) for i in range(len(output) - n + 1)]
    return sum(g in grams for g in outs) / len(outs) if outs else 0.0


def _run(llm, prompts: list[list[int]], params, streams: int
         ) -> tuple[float, float, list, list]:
    """Decode every prompt, `streams` at a time. Returns (decode tokens/s, seconds per decode
    step, outputs, stats)."""
    eng = llm.engine
    tokens = secs = 0.0
    steps = 0
    outs, stats = [], []
    for i in range(0, len(prompts), streams):
        seqs = [eng.add_request(p, params) for p in prompts[i:i + streams]]
        t_first = None
        while eng.has_work():
            eng.step()
            if t_first is not None:
                steps += 1
            elif all(s.output_ids for s in seqs):
                t_first = time.perf_counter()
        secs += time.perf_counter() - t_first
        tokens += sum(len(s.output_ids) - 1 for s in seqs)
        outs += [list(s.output_ids) for s in seqs]
        stats += [s.spec_stats for s in seqs]
    eng.check_integrity()
    return tokens / secs, secs / max(steps, 1), outs, stats


def _load(args):
    """(model argument for LLM, loaded weights): --model, or a random-weight --shape written
    to a temporary checkpoint (the tiny MiMo-V2-Flash has MTP layers)."""
    from ..models import registry
    if args.shape is None:
        return args.model, registry.load(args.model, progress=False)
    import atexit
    import shutil
    import tempfile

    from ..models import make_tiny
    d = tempfile.mkdtemp(prefix="mimo-bench-spec-")
    atexit.register(shutil.rmtree, d, True)
    make_tiny.write(args.shape.removesuffix("-tiny").replace("-", "_"), d, seed=0)
    return d, registry.load(d, progress=False)


def run(args) -> int:
    from .. import LLM, SamplingParams
    from ..cpu.features import cpu_info
    from ..spec.stats import SpecStats
    model, loaded = _load(args)
    common = dict(progress=False, loaded=loaded, dtype=args.dtype, quantize=args.quantize,
                  num_threads=args.threads, max_num_seqs=max(1, args.streams),
                  kv_cache_memory=args.kv_cache_memory, fused_decode=args.fused_decode)
    llms = {"off": LLM(model, **common),
            "on": LLM(model, speculative=args.drafter,
                      num_draft_tokens=args.num_draft_tokens, **common)}
    tok = llms["off"].tokenizer
    prompts = [tok.encode(t) for t in copy_prompts(max(args.streams, args.prompts))]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_tokens=4)
    for llm in llms.values():
        llm.generate({"prompt_token_ids": prompts[0][:32]}, warm)
    tps = {"off": [], "on": []}
    step_s = {"off": [], "on": []}
    outputs: dict[str, list] = {}
    lossless = True
    total = SpecStats()
    for rep in range(args.reps):
        for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            rate, per_step, outs, stats = _run(llms[mode], prompts, params, max(1, args.streams))
            tps[mode].append(rate)
            step_s[mode].append(per_step)
            if mode == "on":
                for s in stats:
                    total.add(s)
            ref = outputs.setdefault("ref", outs)
            lossless &= outs == ref
            _log(f"rep {rep + 1}/{args.reps} speculation {mode}: {rate:.2f} decode tokens/s")
    off, on = sum(tps["off"]) / len(tps["off"]), sum(tps["on"]) / len(tps["on"])
    # Each repetition's pair ran back to back: its ratio is the least disturbed by load drift.
    pairs = sorted(b / a for a, b in zip(tps["off"], tps["on"]))
    median = (pairs[(len(pairs) - 1) // 2] + pairs[len(pairs) // 2]) / 2
    copy = sum(copy_fraction(p, o) for p, o in zip(prompts, outputs["ref"])) / len(prompts)
    step_ms = {m: 1000 * sum(v) / len(v) for m, v in step_s.items()}
    res = {"bench": NAME, "model": args.shape or args.model, "drafter": args.drafter,
           "workload": args.workload, "num_draft_tokens": args.num_draft_tokens,
           "prompts": len(prompts), "streams": args.streams, "max_tokens": args.max_tokens,
           "reps": args.reps, "threads": args.threads,
           "dtype": llms["off"].engine.config.runtime.dtype,
           "weights": llms["off"].engine.weights.format,
           "kernels": llms["off"].engine.weights.kernels,
           "fused_layers": llms["off"].engine.weights.fused_layers,
           "cpu": cpu_info().model, "cpu_flags": sorted(cpu_info().flags),
           "decode_tps_off": round(off, 2), "decode_tps_on": round(on, 2),
           "speedup": round(on / off, 3), "speedup_median_of_pairs": round(median, 3),
           "speedup_per_rep": [round(x, 3) for x in pairs],
           "step_ms_off": round(step_ms["off"], 3), "step_ms_on": round(step_ms["on"], 3),
           "num_draft_tokens_used": llms["on"].engine.spec.k,
           "mean_acceptance_length": round(total.mean_acceptance_length, 3),
           "acceptance_rate_by_position": [round(r, 3) for r in total.position_rate],
           "lossless": lossless, "copy_fraction": round(copy, 3)}
    _log(f"per decode step: off {step_ms['off']:.1f} ms, on {step_ms['on']:.1f} ms "
         f"({llms['on'].engine.spec.k} drafts/step)")
    _log(f"off {off:.2f} tok/s, on {on:.2f} tok/s, speedup {on / off:.2f}x, mean acceptance "
         f"length {total.mean_acceptance_length:.2f}, lossless {lossless}, copy {copy:.2f}")
    print(json.dumps(res), flush=True)
    return 0 if lossless else 1
