"""cache-sim: prefix-cache hit rate of a request trace, per retention policy and KV budget.

Replays a Mooncake-format trace through the real radix tree and page allocators, no model
(`mimo.kvcache.cache_sim` says how requests become tokens). Per policy and budget it
reports the token-weighted hit rate (cached prompt tokens / prompt tokens); alongside, the
trace's ideal hit rate with unlimited memory. Policies: the retention policies of
`mimo.kvcache.retention.POLICIES` (hybrid layout: SWA layers in their own pool; `hybrid`
caches prompts, `hybrid-output` prompts and outputs), `full-kv` (every layer in one pool,
every cached prefix reusable, whole sequences cached as a plain radix cache does: the
pre-SWA-aware baseline) and `off`. `--no-output-cache` caches prompts only under every
policy, the baseline included. `--bound-baseline` adds full-kv runs at `bound` times each
budget (`bound` as in `kv-capacity` at --bound-context): SWA's capacity gain carried into hit rate means the
hybrid policy at B comes close to full-kv at bound x B.

Replays run in parallel processes (--jobs). Progress goes to stderr; the last line on
stdout is one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from ..config import ConfigError, parse_size
from ..kvcache.cache_sim import (
    BLOCK,
    CacheSim,
    estimate_swa_share,
    ideal_hit_rates,
    load_trace,
    size_swa_share,
)
from ..kvcache.layout import DTYPE_BYTES, KNOWN_SHAPES, shape_layout
from ..kvcache.retention import POLICIES
from . import add_trace_arg
from .kv_capacity import ideal_bound

NAME = "cache-sim"
BASELINES = ("full-kv", "off")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="prefix-cache hit rate of a trace: hybrid vs full-kv",
                              description=__doc__.split("\n\n")[0])
    add_trace_arg(p)
    p.add_argument("--shape", default="mimo-v2-flash", choices=sorted(KNOWN_SHAPES))
    p.add_argument("--kv-budget", default="200GiB",
                   help="KV byte budget, or a comma-separated list to sweep (200GiB,2TiB)")
    p.add_argument("--policy", default="hybrid,full-kv",
                   help=f"comma-separated: {', '.join([*POLICIES, *BASELINES])}")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--align", type=int, default=BLOCK,
                   help="cached sequences and prompt checkpoints end on multiples of this "
                        "(the trace's block size)")
    p.add_argument("--swa-share", default="auto",
                   help="fraction of the budget for the SWA pool; 'auto': room for the tail "
                        "window of every sequence the cache holds at its peak, measured by a "
                        "sizing replay per budget (policies that cache prompts only; with "
                        "outputs cached, as 'fill'); 'fill': sized so both pools fill "
                        "together (no replay)")
    p.add_argument("--dense-every", type=int, default=None, metavar="TOKENS",
                   help="override the hybrid policies' speculative checkpoint grid "
                        "(tokens between checkpoints; 0: none)")
    p.add_argument("--no-output-cache", action="store_true",
                   help="cache prompts only (reasoning models drop their output from the "
                        "next turn); applies to every policy")
    p.add_argument("--window-rebuild", action=argparse.BooleanOptionalAction, default=True,
                   help="hybrid: a prefix whose SWA window is gone is reused up to the SWA "
                        "receptive field before its end, as the engine does (--no-window-"
                        "rebuild: cut back to the last kept window)")
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk (SWA transient)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--bound-baseline", action="store_true",
                   help="also run full-kv at bound x each budget")
    p.add_argument("--bound-context", type=int, default=32768)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw hit rate against memory per policy (needs matplotlib)")
    return p


_REQS: list = []     # the trace, shared with forked workers


def _replay(job: dict) -> dict:
    hybrid = shape_layout(job["shape"], job["dtype"])
    full_kv = shape_layout(job["shape"], job["dtype"], layout="full-kv")
    sim = CacheSim(hybrid, full_kv, job["budget"], job["policy"], page_size=job["page"],
                   align=job["align"], swa_share=job["share"], chunk=job["chunk"],
                   output=job["output"], retention=_retention(job["policy"], job["dense"]),
                   rebuild=job["rebuild"])
    label = f"{job['policy']}@{job['budget'] / 2**30:.0f}GiB"
    res = sim.run(_REQS, progress=sys.stderr, label=label, every_s=10.0)
    res["swa_share"] = job["share"] if sim.hybrid else None
    print(f"[{NAME}] {label}: hit rate {res['hit_rate']} in {res['seconds']}s",
          file=sys.stderr, flush=True)
    return res


def _size(job: dict) -> dict:
    hybrid = shape_layout(job["shape"], job["dtype"])
    full_kv = shape_layout(job["shape"], job["dtype"], layout="full-kv")
    return size_swa_share(_REQS, hybrid, full_kv, job["budget"],
                          _retention(job["policy"], job["dense"]), job["page"], job["align"],
                          job["chunk"], job["output"], job["rebuild"], progress=sys.stderr)


def _map(fn, jobs: list, n_jobs: int) -> list:
    """fn over jobs, in forked worker processes when more than one may run."""
    n = max(1, min(n_jobs, len(jobs)))
    if n == 1:
        return [fn(j) for j in jobs]
    import multiprocessing as mp
    with mp.get_context("fork").Pool(n) as pool:
        return pool.map(fn, jobs, chunksize=1)


def _share_rule(value: str):
    """--swa-share: 'auto', 'fill' or a fraction in (0, 1)."""
    if value in ("auto", "fill"):
        return value
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0 < share < 1:
        raise ConfigError(f"--swa-share must be 'auto', 'fill' or a fraction in (0, 1), "
                          f"not {value!r}")
    return share


def _retention(policy: str, dense_every: int | None):
    """The named policy, with --dense-every applied (None: as named; baselines: None)."""
    if policy not in POLICIES:
        return None
    pol = POLICIES[policy]
    return pol if dense_every is None else dataclasses.replace(pol, dense_every=dense_every)


def _summary(results: list[dict], ideal: float) -> dict:
    """Side-by-side ratios per budget: the targets' numbers."""
    by = {(r["policy"], r["kv_budget_bytes"]): r["hit_rate"] for r in results}
    out = {}
    for (pol, b), hit in sorted(by.items(), key=lambda x: (x[0][1], x[0][0])):
        row = out.setdefault(f"{b / 2**30:g}GiB", {})
        row[pol] = hit
        if pol not in BASELINES:
            row[f"{pol}_over_ideal"] = round(hit / ideal, 4) if ideal else None
            fk = by.get(("full-kv", b))
            if fk:
                row[f"{pol}_over_full_kv"] = round(hit / fk, 3)
    return out


def measure(args) -> dict:
    global _REQS
    budgets = [parse_size(b.strip()) for b in str(args.kv_budget).split(",") if b.strip()]
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES and p not in BASELINES]
    if bad or not policies or not budgets:
        raise ConfigError(f"unknown policy {bad}; known: {', '.join([*POLICIES, *BASELINES])}")
    if args.dense_every is not None and args.dense_every < 0:
        raise ConfigError("--dense-every must be >= 0 (0: no speculative checkpoints)")
    if args.align % args.page_size:
        raise ConfigError("--align must be a multiple of --page-size")
    _REQS = load_trace(args.trace, args.limit)
    hybrid = shape_layout(args.shape, args.dtype)
    bound = ideal_bound(hybrid, args.bound_context)
    output = not args.no_output_cache
    share_rule = _share_rule(args.swa_share)
    common = dict(shape=args.shape, dtype=args.dtype, page=args.page_size, align=args.align,
                  chunk=args.chunk, output=None if output else False, dense=args.dense_every,
                  rebuild=args.window_rebuild)
    t0 = time.perf_counter()
    sizing = {}                 # (policy, budget) -> size_swa_share's answer (auto)
    if share_rule == "auto":
        todo = [dict(common, policy=p, budget=b) for b in budgets for p in policies
                if p in POLICIES]
        for j, r in zip(todo, _map(_size, todo, args.jobs)):
            sizing[j["policy"], j["budget"]] = r
    jobs = []
    for b in budgets:
        for p in policies:
            share = 0.0
            if p in POLICIES and share_rule == "auto":
                share = sizing[p, b]["swa_share"]
            elif p in POLICIES and share_rule == "fill":
                share = estimate_swa_share(_REQS, hybrid, _retention(p, args.dense_every),
                                           args.page_size, args.align, common["output"])
            elif p in POLICIES:
                share = share_rule
            jobs.append(dict(common, policy=p, budget=b, share=round(share, 4)))
        if args.bound_baseline:
            jobs.append(dict(common, policy="full-kv", budget=int(b * bound), share=0.0,
                             bound_of=b))
    results = _map(_replay, jobs, args.jobs)
    for j, r in zip(jobs, results):
        if "bound_of" in j:
            r["policy"], r["bound_of_bytes"] = "full-kv@bound", j["bound_of"]
        elif (j["policy"], j["budget"]) in sizing:
            r["swa_sizing"] = {k: (round(v, 4) if isinstance(v, float) else v)
                               for k, v in sizing[j["policy"], j["budget"]].items()
                               if k != "swa_share"}
    ideal = ideal_hit_rates(_REQS, BLOCK)
    summary = _summary([r for r in results if "bound_of_bytes" not in r],
                       ideal["ideal_hit_rate"])
    for r in results:
        if "bound_of_bytes" in r:
            row = summary.setdefault(f"{r['bound_of_bytes'] / 2**30:g}GiB", {})
            row["full_kv_at_bound"] = r["hit_rate"]
            for p in policies:
                if p in POLICIES and p in row:
                    row[f"{p}_over_full_kv_at_bound"] = round(row[p] / r["hit_rate"], 4)
    return {"trace": str(args.trace), "requests": len(_REQS), "shape": args.shape,
            "dtype": args.dtype, "page_size": args.page_size, "align": args.align,
            "no_output_cache": args.no_output_cache, "window": hybrid.window,
            "window_rebuild_tokens": hybrid.swa_receptive_field if args.window_rebuild else 0,
            "bound": round(bound, 4),
            "bound_context": args.bound_context, **{k: round(v, 4) for k, v in ideal.items()},
            "summary": summary, "results": results,
            "seconds": round(time.perf_counter() - t0, 1)}


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list] = {}
    for r in res["results"]:
        if r["policy"] != "full-kv@bound":
            series.setdefault(r["policy"], []).append((r["kv_budget_bytes"] / 2**30, r["hit_rate"]))
    for pol, pts in sorted(series.items()):
        pts.sort()
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=pol)
    ax.axhline(res["ideal_hit_rate"], color="gray", linestyle="--",
               label=f"ideal (unlimited memory) {res['ideal_hit_rate']:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel(f"KV memory (GiB), {res['shape']} {res['dtype']}")
    ax.set_ylabel("prompt tokens served from cache")
    ax.set_title(f"{Path(res['trace']).name}: {res['requests']} requests")
    ax.set_ylim(0, max(0.05, res["ideal_hit_rate"] * 1.15))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"{NAME}: --plot needs matplotlib, which is not installed "
                  "(pip install matplotlib); run without --plot for the numbers",
                  file=sys.stderr)
            return 2
    try:
        res = measure(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    for budget, row in res["summary"].items():
        print(f"[{NAME}] {budget}: " + ", ".join(f"{k}={v}" for k, v in row.items()),
              file=sys.stderr)
    if args.plot:
        plot(res, args.plot)
        print(f"[{NAME}] plot written to {args.plot}", file=sys.stderr)
    print(json.dumps(res), flush=True)
    return 0
