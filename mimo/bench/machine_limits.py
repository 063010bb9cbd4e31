"""The machine's own limits, measured in the run that compares servers against them:

- matmul rate: the faster of a float32 and a bf16 `torch.nn.functional.linear` of prefill
  shape ([tokens, hidden] by [out, hidden]; default [3000, 640] x [2048, 640], Gemma 3
  270M's MLP up projection over a 3,000-token prompt), FLOP/s = 2 x tokens x hidden x out
  / seconds; both are reported, and the int8 rate of mimo's Q8_0 block kernel on 64 rows
  of that shape;
- memory read bandwidth: a float32 sum and a plain int64 sum over a buffer much larger than
  any cache (1 GiB), and a bf16 matrix-vector product over one (what a decode step does to
  its weights); the fastest of the three, bytes / seconds.

Buffers are filled before timing (torch.empty's untouched pages would read the shared zero
page, far faster than memory). Each figure is the best of `reps` timed calls after one
warm-up call, on `threads` threads (set on torch for the measurement).

    python -m mimo.bench.machine_limits [--threads 2] [--quick] [--read-only]  # one JSON line

The peers bench runs this in a subprocess before the first server and after the last, so
its own process holds no torch threads while servers run, and `--read-only` (the read rate
alone, a few seconds) between the servers' turns: this machine's read rate moves by up to 2x
within minutes, so a turn's figures are also put against the rate measured next to it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def _best(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def matmul_rate(tokens: int, hidden: int, out: int, reps: int, dtype: str = "bfloat16") -> float:
    """FLOP/s of a linear [tokens, hidden] x [out, hidden]^T in `dtype`."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(getattr(torch, dtype))
    w = torch.randn(out, hidden, generator=g).to(getattr(torch, dtype))
    s = _best(lambda: F.linear(x, w), reps)
    return 2.0 * tokens * hidden * out / s


def int8_rate(tokens: int, hidden: int, out: int, reps: int) -> float | None:
    """OP/s of mimo's Q8_0 block kernel (int8 dot products) on the same shape, at most 64
    rows (the kernel serves decode-sized steps); None without the kernels."""
    import torch

    from mimo.cpu import extension
    from mimo.models.quantized import q8_0_blocks
    ext = extension.load()
    if ext is None:
        return None
    g = torch.Generator().manual_seed(0)
    rows = min(tokens, 64)
    x = torch.randn(rows, hidden, generator=g)
    part = q8_0_blocks(torch.randn(out, hidden, generator=g))
    s = _best(lambda: ext.qlinear(x, [part.data], [part.qtype]), reps)
    return 2.0 * rows * hidden * out / s


def read_bandwidth(nbytes: int, reps: int) -> dict[str, float]:
    """Bytes/s of reading `nbytes`: float32 and int64 sums, a bf16 matrix-vector product."""
    import torch
    import torch.nn.functional as F
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    words = buf.view(torch.int64)    # a plain integer sum (it wraps): no cascade summation
    out = {"sum_float32": nbytes / _best(buf.sum, reps),
           "sum_int64": nbytes / _best(words.sum, reps)}
    del buf, words                   # the matrix below takes their place, not beside them
    cols = 4096
    w = torch.ones(nbytes // 2 // cols, cols, dtype=torch.bfloat16)
    v = torch.ones(1, cols, dtype=torch.bfloat16)
    out["gemv_bfloat16"] = w.numel() * 2 / _best(lambda: F.linear(v, w), reps)
    return out


def _kernel_label(isa: str | None) -> str:
    """The build, "+amx" where its 16-row products run on the AMX-INT8 tiles."""
    if isa is None:
        return "none"
    from mimo.cpu import extension
    ext = extension.load(isa)
    return isa if ext is None else extension.label(ext)


def read_rate(threads: int, quick: bool = False, reps: int = 5) -> dict:
    """The memory read rate alone (read_bandwidth's fastest method), on `threads` threads."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        nbytes = (128 if quick else 1024) * 2**20
        reads = read_bandwidth(nbytes, reps)
    finally:
        torch.set_num_threads(before)
    method = max(reads, key=lambda k: reads[k])
    return {"threads": threads, "read_bytes": nbytes,
            "bandwidth_gbs": round(reads[method] / 1e9, 2), "bandwidth_method": method,
            "bandwidth_gbs_by_method": {k: round(v / 1e9, 2) for k, v in reads.items()}}


def measure(threads: int, quick: bool = False, reps: int = 5,
            matmul_shape: tuple[int, int, int] = (3000, 640, 2048)) -> dict:
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        shape = (512, 640, 2048) if quick else matmul_shape
        rates = {d: matmul_rate(*shape, reps=reps, dtype=d) for d in ("float32", "bfloat16")}
        i8 = int8_rate(*shape, reps=reps)
    finally:
        torch.set_num_threads(before)
    from mimo.cpu.features import chosen_isa, cpu_info
    info = cpu_info()
    best = max(rates, key=lambda k: rates[k])
    return {"cpu": info.model, "cpu_flags": sorted(info.flags),
            # what runs on them: mimo's kernel build ($MIMO_CPU_ISA forces one) and
            # torch's own vector code ($ATEN_CPU_CAPABILITY)
            "kernel_isa": _kernel_label(chosen_isa(info)),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "matmul_shape": list(shape), "matmul_dtype": best,
            "matmul_gflops": round(rates[best] / 1e9, 1),
            "matmul_gflops_by_dtype": {k: round(v / 1e9, 1) for k, v in rates.items()},
            "int8_kernel_gops": None if i8 is None else round(i8 / 1e9, 1),
            **read_rate(threads, quick, reps),
            "reps": reps}


def best_of(before: dict, after: dict) -> dict:
    """The higher of each rate of two measurements (before and after a bench's runs): other
    jobs' load only lowers a measured limit, and a limit set too low inflates every
    fraction of it. Both measurements are kept under 'before' and 'after'."""
    best = dict(before)
    for k in ("matmul_gflops", "bandwidth_gbs"):
        best[k] = max(before[k], after[k])
    best["bandwidth_method"] = (before if before["bandwidth_gbs"] >= after["bandwidth_gbs"]
                                else after)["bandwidth_method"]
    best["before"], best["after"] = before, after
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mimo.bench.machine_limits",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run; caches help)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--read-only", action="store_true", help="the memory read rate alone")
    a = p.parse_args(argv)
    out = read_rate(a.threads, a.quick, a.reps) if a.read_only else measure(a.threads, a.quick, a.reps)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
