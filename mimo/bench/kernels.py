"""kernels: the CPU kernels against the machine's limits, measured in the same run.

For every kernel build this CPU runs (and the plain PyTorch path for comparison), the
product of the default model's real weights (its GGUF blocks: the Q8_0 tied head, and one
layer's Q5_0 / Q4_K / Q6_K projections) with 1, 4, 8 and 16 activation rows, and the fused
greedy head (top-1, no logits written); the VNNI build with its AMX-INT8 tiles off and, for
the rows they take, on ("avx512-vnni+amx") where the CPU has them; weights the build can
repack (Q5_0, Q4_K, Q6_K in 8-row tiles) are timed both as stored and repacked, side by
side. Each figure is given as weight bytes read per second and as a fraction of the memory
read rate measured here (machine_limits).

    python -m mimo.bench kernels [--threads N] [--reps 5]

Progress on stderr; one JSON line last, naming the CPU and its instruction sets.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("kernels", help="CPU kernels (GGUF blocks) against memory bandwidth")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per figure (best kept)")
    p.add_argument("--rows", default="1,4,8,16", help="activation rows to time")
    return p


def best_time(fn, reps: int, *args) -> float:
    """Seconds of fn(*args): the best of `reps` runs after one warm-up."""
    fn(*args)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


def _weights():
    from mimo.models import registry
    from mimo.models.gguf_loader import gguf_blocks, open_gguf
    f = open_gguf(registry.resolve("gemma-3-270m"))
    try:
        blocks = gguf_blocks(f)
    finally:
        f.close()
    pick = {"head (Q8_0)": "model.embed_tokens.weight",
            "mlp gate (Q5_0)": "model.layers.0.mlp.gate_proj.weight",
            "attn out (Q4_K)": "model.layers.0.self_attn.o_proj.weight",
            "mlp down (Q6_K)": "model.layers.0.mlp.down_proj.weight"}
    return {k: blocks[v] for k, v in pick.items()}


def run(args) -> int:
    import torch

    from mimo.bench.machine_limits import measure
    from mimo.cpu import extension
    from mimo.cpu.features import ISAS, cpu_info
    from mimo.cpu.qmatrix import QuantMatrix

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    info = cpu_info()
    print(f"CPU: {info.summary()}, {threads} threads", file=sys.stderr)
    limits = measure(threads)
    bw = limits["bandwidth_gbs"] * 1e9
    print(f"memory read: {bw / 1e9:.1f} GB/s", file=sys.stderr)
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    for isa in [i for i in ISAS if info.supports(i)]:
        ext = extension.load(isa)
        if ext is None:
            continue
        before = ext.amx_tiles()
        # the VNNI build with its AMX-INT8 tiles off and on, where the CPU has them
        modes = [False] + ([True] if ext.set_amx_tiles(True) else [])
        todo = []
        for name, part in _weights().items():
            todo.append((name, part))
            tiled = part.repacked(ext)
            if tiled is not part:
                todo.append((f"{name} repacked", tiled))
        for name, part in todo:
            qm = QuantMatrix([part])
            for m, amx in [(m, a) for m in rows for a in modes
                           if not a or m >= ext.amx_rows()]:
                ext.set_amx_tiles(amx)
                x = torch.randn(m, part.cols)
                t = best_time(ext.qlinear, args.reps, x, [part.data], [part.qtype])
                row = {"isa": extension.label(ext), "weight": name, "rows": m,
                       "ms": round(t * 1e3, 3), "gbs": round(qm.nbytes / t / 1e9, 2),
                       "bandwidth_fraction": round(qm.nbytes / t / bw, 3)}
                if name.startswith("head"):
                    tk = best_time(ext.qtopk, args.reps, x, part.data, part.qtype, 1)
                    row["top1_ms"] = round(tk * 1e3, 3)
                    row["top1_bandwidth_fraction"] = round(qm.nbytes / tk / bw, 3)
                results.append(row)
                print(json.dumps(row), file=sys.stderr)
        ext.set_amx_tiles(before)
    head = _weights()["head (Q8_0)"]
    dense = head.dequantize()
    for dtype in (torch.float32, torch.bfloat16):
        w = dense.to(dtype)
        for m in rows:
            x = torch.randn(m, head.cols, dtype=dtype)
            t = best_time(torch.nn.functional.linear, args.reps, x, w)
            row = {"isa": f"torch {str(dtype)[6:]}", "weight": "head (dense)", "rows": m,
                   "ms": round(t * 1e3, 3), "gbs": round(w.numel() * w.element_size() / t / 1e9, 2)}
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"bench": "kernels", "cpu": info.model, "cpu_flags": sorted(info.flags),
                      "threads": threads, "limits": limits, "results": results}))
    return 0
