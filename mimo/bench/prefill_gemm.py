"""prefill-gemm: prefill's products on the GGUF blocks against the dense GEMM.

Layer 0 of the default model: its four products (q/k/v, o, gate/up, down) at prefill-sized
row counts, the dense `F.linear` in the model dtype (with the casts a Linear does) against
the blocks' GEMM (`qgemm`) and the decode tiles taken 16 rows at a time (`qlinear`), best of
--reps; then, with --prompts, the offline prefill time of random prompts of those lengths
(`max_tokens=1`, stepped until done, best of 2) for each --prefill-matmul mode.

    python -m mimo.bench prefill-gemm [--threads 2] [--rows 64,256,512] [--prompts 256,3000]

Progress on stderr; one JSON line last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .kernels import best_time


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("prefill-gemm", help="prefill products: GGUF blocks GEMM vs dense GEMM")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per figure (best kept)")
    p.add_argument("--rows", default="64,256,512", help="activation rows to time")
    p.add_argument("--prompts", default="", help="prompt lengths to prefill offline (comma)")
    p.add_argument("--modes", default="dense,blocks", help="--prefill-matmul modes to prefill")
    return p


def _best(fn, reps: int, *args) -> float:
    """Milliseconds: kernels.best_time's best of `reps` after a warm-up."""
    return best_time(fn, reps, *args) * 1e3


def _dense(x, w):
    import torch.nn.functional as F
    return F.linear(x.to(w.dtype), w)


def _blocks(f, x, ws, ts, dtype):
    return f(x, ws, ts).to(dtype)


def _products(llm, rows: list[int], reps: int) -> list[dict]:
    import torch

    from mimo.cpu import extension
    from mimo.models.layers import Linear
    ext = extension.load()
    layer = llm.engine.model.layers[0]
    out = []
    for m in rows:
        for name, lin in layer.named_modules():
            if not isinstance(lin, Linear) or lin.qweight is None:
                continue
            x = torch.randn(m, lin.weight.shape[1])
            ws, ts = [p.data for p in lin.qweight.parts], [p.qtype for p in lin.qweight.parts]
            w = lin.weight
            row = {"rows": m, "product": name, "shape": list(w.shape),
                   "dense_ms": _best(_dense, reps, x, w)}
            if ext is not None:
                row["qgemm_ms"] = _best(_blocks, reps, ext.qgemm, x, ws, ts, w.dtype)
                row["qlinear_ms"] = _best(_blocks, reps, ext.qlinear, x, ws, ts, w.dtype)
            out.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
            print(json.dumps(out[-1]), file=sys.stderr)
    return out


def _prefill(mode: str, lengths: list[int]) -> list[dict]:
    import torch

    from mimo import LLM, SamplingParams
    llm = LLM("gemma-3-270m", progress=False, prefill_matmul=mode)
    gen = torch.Generator().manual_seed(0)
    vocab = llm.engine.model_config.vocab_size

    def once(n: int) -> float:
        ids = torch.randint(10, vocab, (n,), generator=gen).tolist()
        t = time.perf_counter()
        s = llm.engine.add_request(ids, SamplingParams(max_tokens=1))
        while s.finish_reason is None:
            llm.engine.step()
        dt = time.perf_counter() - t
        llm.engine.abort(s)
        return dt
    once(64)
    out = []
    for n in lengths:
        out.append({"mode": mode, "prefill": llm.engine.weights.prefill, "tokens": n,
                    "seconds": round(min(once(n) for _ in range(2)), 3)})
        print(json.dumps(out[-1]), file=sys.stderr)
    return out


def run(args) -> int:
    import torch

    from mimo import LLM
    from mimo.cpu.features import cpu_info
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM("gemma-3-270m", progress=False, prefill_matmul="dense")
    products = _products(llm, [int(r) for r in args.rows.split(",") if r], args.reps)
    del llm
    lengths = [int(n) for n in args.prompts.split(",") if n]
    prefill = [r for mode in args.modes.split(",") if lengths for r in _prefill(mode, lengths)]
    print(json.dumps({"bench": "prefill-gemm", "cpu": cpu_info().summary(),
                      "threads": torch.get_num_threads(), "products": products,
                      "prefill": prefill}))
    return 0
