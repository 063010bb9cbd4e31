"""kv-capacity: how many requests of one context length fit in a KV byte budget.

Synthetic requests go through the real bookkeeping (`DualPool(..., allocate=False)`, pools
sized by `plan_pages`) the way the engine drives it: prefill in chunks, releasing the SWA
window after each chunk, then one decode step. Requests are admitted one after another
until one no longer fits. Done once in the hybrid layout (SWA layers keep only their window)
and once in the full-kv baseline (every layer in the full pool), so the ratio of the two
counts is the capacity gain of SWA-aware caching.

`bound` is the gain an ideal, page-free cache would get: a full-kv request holds every layer
for `context` tokens; an ideal hybrid one holds full layers for `context` tokens and SWA layers
for `window` tokens. Paging (SWA held up to window + one page) and the transient SWA need of
the last request's prefill chunk keep the measured ratio a little below it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..config import CacheConfig, ConfigError, parse_size
from ..kvcache.pool.allocator import OutOfPages
from ..kvcache.pool.dual_pool import DualPool
from ..kvcache.pool.layout import DTYPE_BYTES, KNOWN_SHAPES, KVLayout, plan_pages, shape_layout

NAME = "kv-capacity"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="requests that fit in a KV budget: hybrid vs full-kv",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", required=True, choices=sorted(KNOWN_SHAPES),
                   help="model KV shape (no weights needed)")
    p.add_argument("--context", type=int, default=32768, help="tokens per request (prompt)")
    p.add_argument("--kv-budget", default="80GiB", help="KV byte budget, e.g. 80GiB, 512MiB")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk in tokens")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    p.add_argument("--swa-share", type=float, default=None,
                   help="fraction of the budget for the SWA pool (default: derived so both "
                        "pools fill together at --context)")
    return p


class _Progress:
    """Throttled stderr lines: long runs show they are alive, short ones stay quiet."""

    def __init__(self, label: str, expected: int, stream, every_s: float = 1.0):
        self.label, self.expected, self.stream, self.every = label, max(expected, 1), stream, every_s
        self.t0 = self.last = time.perf_counter()

    def tick(self, n: int) -> None:
        now = time.perf_counter()
        if self.stream is not None and now - self.last >= self.every:
            self.last = now
            print(f"[{NAME}] {self.label}: {n} requests admitted (~{100 * n // self.expected}% "
                  f"of the estimate), {now - self.t0:.1f}s", file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def count_requests(layout: KVLayout, cache: CacheConfig, context: int, chunk: int,
                   label: str = "", progress=None) -> dict:
    """Admit requests of `context` tokens + one decode token until one does not fit."""
    if context < 1 or chunk < 1:
        raise ConfigError("context and chunk must be >= 1")
    page = cache.page_size
    full_pages, swa_pages = plan_pages(layout, cache, context, chunk=chunk)
    dp = DualPool(layout, full_pages, swa_pages, page, allocate=False)
    prog = _Progress(label, cache.kv_cache_memory // layout.request_bytes(context, page), progress)
    n, limited_by = 0, None
    admitted = []   # held like a scheduler holds them: DualPool tracks sequences by id()
    while True:
        seq = dp.new_seq()
        try:
            pos = 0
            while pos < context:
                pos = min(pos + chunk, context)
                dp.grow(seq, pos)
                dp.release_window(seq, pos)
            dp.grow(seq, context + 1)           # one decode step
            dp.release_window(seq, context + 1)
        except OutOfPages:
            need_f, need_s = dp.pages_to_grow(seq, min(pos + chunk, context + 1))
            limited_by = "full" if need_f > dp.full.allocator.num_free else "swa"
            dp.free_seq(seq)
            break
        admitted.append(seq)
        n += 1
        prog.tick(n)
    dp.check_integrity()
    assert dp.num_live_seqs == n
    return {"requests": n, "limited_by": limited_by, "seconds": round(prog.elapsed(), 3),
            "full_pages": full_pages, "swa_pages": swa_pages,
            "full_bytes": full_pages * page * layout.full_bytes_per_token,
            "swa_bytes": swa_pages * page * layout.swa_bytes_per_token,
            "pools": dp.stats()}


def ideal_bound(layout: KVLayout, context: int) -> float:
    """full-kv bytes per request / ideal hybrid bytes per request (no pages, window only)."""
    fb, sb = layout.full_bytes_per_token, layout.swa_bytes_per_token
    return (fb + sb) * context / (fb * context + sb * min(layout.window, context))


def measure(shape: str, context: int, kv_budget: int | str, page_size: int = 16,
            chunk: int = 2048, dtype: str = "bfloat16", swa_share: float | None = None,
            progress=None) -> dict:
    budget = parse_size(kv_budget)
    cache = CacheConfig(page_size=page_size, kv_cache_memory=budget, swa_share=swa_share)
    hybrid = shape_layout(shape, dtype)
    full_kv = shape_layout(shape, dtype, layout="full-kv")
    h = count_requests(hybrid, cache, context, chunk, "hybrid", progress)
    f = count_requests(full_kv, cache, context, chunk, "full-kv", progress)
    ratio = h["requests"] / f["requests"] if f["requests"] else None
    bound = ideal_bound(hybrid, context)
    return {
        "shape": shape, "context": context, "kv_budget_bytes": budget,
        "page_size": page_size, "chunk": chunk, "dtype": dtype, "swa_share": swa_share,
        "window": hybrid.window,
        "hybrid_requests": h["requests"], "full_kv_requests": f["requests"],
        "ratio": None if ratio is None else round(ratio, 4),
        "bound": round(bound, 4),
        "ratio_over_bound": None if ratio is None else round(ratio / bound, 4),
        "bytes_per_token": {"full": hybrid.full_bytes_per_token,
                            "swa": hybrid.swa_bytes_per_token,
                            "full_kv": full_kv.full_bytes_per_token},
        "hybrid": h, "full_kv": f,
    }


def run(args) -> int:
    try:
        res = measure(args.shape, args.context, args.kv_budget, args.page_size, args.chunk,
                      args.dtype, args.swa_share, progress=sys.stderr)
    except ConfigError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    for k in ("hybrid", "full_kv"):
        r = res[k]
        print(f"[{NAME}] {k}: {r['requests']} requests, limited by the {r['limited_by']} pool, "
              f"{r['seconds']}s", file=sys.stderr)
    print(json.dumps(res), flush=True)
    return 0
