"""cache-sim: prefix-cache hit rate of a request trace, per retention policy and KV budget.

Replays a Mooncake-format trace through the real radix tree and page allocators, no model
(`mimo.bench.sim_cache` says how requests become tokens). Per policy and budget it
reports the token-weighted hit rate (cached prompt tokens / prompt tokens); alongside, the
trace's ideal hit rate with unlimited memory. Policies: the retention policies (hybrid
layout), `full-kv` (every layer in one pool, whole sequences cached as a plain radix cache
does: the pre-SWA-aware baseline) and `off`. `--no-output-cache`: prompts only, under every policy.
`--bound-baseline` adds full-kv runs at `bound` (as in `kv-capacity`) times each budget.

`--l2-budget` and `--l3-budget` add host memory (L2, write-back of what L1 evicts) and storage
(L3, write-through) below L1 for the hybrid policies and full-kv (`mimo.bench.sim_tiers`):
hit rate by tier, bytes moved per reused token, bytes written per tier and the age of the
prefixes hit. `--tier-scale` sweeps all three budgets together, for `--plot`.

Replays run in parallel processes (--jobs); progress on stderr, one JSON line last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from ..bench.sim_tiers import TieredCacheSim
from ..config import ConfigError, parse_size
from ..kvcache.pool.layout import DTYPE_BYTES, KNOWN_SHAPES, shape_layout
from ..kvcache.radix.retention import POLICIES
from . import add_trace_arg
from .kv_capacity import ideal_bound
from .sim_cache import (
    BLOCK,
    CacheSim,
    estimate_swa_share,
    ideal_hit_rates,
    load_trace,
    size_swa_share,
)

NAME = "cache-sim"
BASELINES = ("full-kv", "off")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="prefix-cache hit rate of a trace: hybrid vs full-kv",
                              description=__doc__.split("\n\n")[0])
    add_trace_arg(p)
    p.add_argument("--shape", default="mimo-v2-flash", choices=sorted(KNOWN_SHAPES))
    p.add_argument("--kv-budget", default="200GiB",
                   help="KV byte budget, or a comma-separated list to sweep (200GiB,2TiB)")
    p.add_argument("--l2-budget", default="0",
                   help="host-memory tier (L2) below L1: byte budget, or a comma-separated list "
                        "(0: none). What L1 evicts goes down to it; it drops its LRU pages. "
                        "Tiers apply to the hybrid policies and full-kv ('off' runs without)")
    p.add_argument("--l3-budget", default="0",
                   help="storage tier (L3): byte budget, or a comma-separated list (0: none). "
                        "Every cached prefix is written through to it when it enters L1")
    p.add_argument("--tier-scale", default="1", metavar="FACTORS",
                   help="comma-separated factors applied to the L1, L2 and L3 budgets together, "
                        "one replay per factor (a sweep for --plot: hit rate against total bytes). "
                        "Points: every --kv-budget x --l2-budget x --l3-budget x factor")
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
                   help="draw hit rate against memory per policy (needs matplotlib); with L2 "
                        "or L3, against L1+L2+L3 bytes, the tiers' shares stacked")
    return p


_REQS: list = []     # the trace, shared with forked workers


def _replay(job: dict) -> dict:
    hybrid = shape_layout(job["shape"], job["dtype"])
    full_kv = shape_layout(job["shape"], job["dtype"], layout="full-kv")
    kw = dict(page_size=job["page"], align=job["align"], swa_share=job["share"],
              chunk=job["chunk"], output=job["output"], rebuild=job["rebuild"],
              retention=_retention(job["policy"], job["dense"]))
    l2, l3 = job.get("l2", 0), job.get("l3", 0)
    tiered = (l2 or l3) and job["policy"] != "off"
    sim = (TieredCacheSim(hybrid, full_kv, job["budget"], job["policy"], l2_budget=l2,
                          l3_budget=l3, **kw) if tiered
           else CacheSim(hybrid, full_kv, job["budget"], job["policy"], **kw))
    label = f"{job['policy']}@{_key(job['budget'], l2, l3)}"
    res = sim.run(_REQS, progress=sys.stderr, label=label, every_s=10.0)
    res["swa_share"] = job["share"] if sim.hybrid else None
    if l2 or l3:                # ('off' has no tiers, but belongs to the same point)
        res["l2_budget_bytes"], res["l3_budget_bytes"] = l2, l3
    line = f"hit rate {res['hit_rate']}"
    if tiered:
        t = res["tiers"]
        age = t["hit_age"]
        line += (" (" + ", ".join(f"{k} {v}" for k, v in t["hit_rate_by_tier"].items())
                 + f"), {t['bytes_moved_per_reused_token'] / 1024:.1f} KiB moved per reused "
                 f"token, hit age p50/p99 {age['all'].get('p50')}/{age['all'].get('p99')} "
                 f"{t['age_unit']} (from L3: {age['L3'].get('p50')}/{age['L3'].get('p99')})")
    print(f"[{NAME}] {label}: {line} in {res['seconds']}s", file=sys.stderr, flush=True)
    return res


def _gib(b: int) -> str:
    return f"{b / 2**30:g}GiB"


def _key(budget: int, l2: int = 0, l3: int = 0) -> str:
    """A budget point's name: '200GiB' (L1 alone) or '200GiB+1024GiB+8192GiB' (L1+L2+L3)."""
    return _gib(budget) if not (l2 or l3) else f"{_gib(budget)}+{_gib(l2)}+{_gib(l3)}"


def _result_key(r: dict) -> str:
    return _key(r["kv_budget_bytes"], r.get("l2_budget_bytes", 0), r.get("l3_budget_bytes", 0))


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
    """Side-by-side ratios per budget point: the targets' numbers."""
    by = {(r["policy"], _result_key(r)): r for r in results}
    order = sorted(by, key=lambda x: (by[x].get("l2_budget_bytes", 0)
                                      + by[x].get("l3_budget_bytes", 0)
                                      + by[x]["kv_budget_bytes"], x[0]))
    out: dict = {}
    for pol, k in order:
        r = by[pol, k]
        row = out.setdefault(k, {})
        row[pol] = hit = r["hit_rate"]
        fk = by.get(("full-kv", k))
        if pol not in BASELINES:
            row[f"{pol}_over_ideal"] = round(hit / ideal, 4) if ideal else None
            if fk:
                row[f"{pol}_over_full_kv"] = round(hit / fk["hit_rate"], 3)
        if "tiers" in r:
            moved = r["tiers"]["bytes_moved_per_reused_token"]
            row[f"{pol}_by_tier"] = r["tiers"]["hit_rate_by_tier"]
            row[f"{pol}_bytes_moved_per_reused_token"] = moved
            if pol not in BASELINES and fk and fk["tiers"]["bytes_moved_per_reused_token"]:
                row[f"{pol}_bytes_moved_over_full_kv"] = round(
                    moved / fk["tiers"]["bytes_moved_per_reused_token"], 4)
    return out


def _sizes(text: str, flag: str) -> list[int]:
    try:
        out = [parse_size(b.strip()) for b in str(text).split(",") if b.strip()]
    except ConfigError as e:
        raise ConfigError(f"{flag}: {e}") from None
    if not out or any(b < 0 for b in out):
        raise ConfigError(f"{flag} must be sizes >= 0, not {text!r}")
    return out


def _points(args) -> list[tuple[int, int, int]]:
    """(L1, L2, L3) budgets: every combination of the lists, times every --tier-scale."""
    try:
        scales = [float(x) for x in str(args.tier_scale).split(",") if x.strip()]
    except ValueError:
        scales = []
    if not scales or any(x <= 0 for x in scales):
        raise ConfigError(f"--tier-scale must be factors > 0, not {args.tier_scale!r}")
    l1s = _sizes(args.kv_budget, "--kv-budget")
    l2s, l3s = _sizes(args.l2_budget, "--l2-budget"), _sizes(args.l3_budget, "--l3-budget")
    pts = [(int(a * x), int(b * x), int(c * x)) for x in scales for a in l1s for b in l2s
           for c in l3s]
    if any(a <= 0 for a, _, _ in pts):
        raise ConfigError("--kv-budget must be > 0")
    return list(dict.fromkeys(pts))


def measure(args) -> dict:
    global _REQS
    points = _points(args)
    budgets = list(dict.fromkeys(b for b, _, _ in points))
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES and p not in BASELINES]
    if bad or not policies:
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
    for b, l2, l3 in points:
        for p in policies:
            share = 0.0
            if p in POLICIES and share_rule == "auto":
                share = sizing[p, b]["swa_share"]
            elif p in POLICIES and share_rule == "fill":
                share = estimate_swa_share(_REQS, hybrid, _retention(p, args.dense_every),
                                           args.page_size, args.align, common["output"])
            elif p in POLICIES:
                share = share_rule
            jobs.append(dict(common, policy=p, budget=b, share=round(share, 4), l2=l2, l3=l3))
    for b in budgets if args.bound_baseline else ():
        jobs.append(dict(common, policy="full-kv", budget=int(b * bound), share=0.0, bound_of=b))
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
            row = summary.setdefault(_key(r["bound_of_bytes"]), {})
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
    if any("tiers" in r for r in res["results"]):
        return plot_tiers(res, path, plt)
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


def plot_tiers(res: dict, path: str, plt) -> None:
    """Hit rate against L1+L2+L3 bytes: a panel per policy, each budget point a bar of the
    shares served from L1, L2 and L3, and every policy's total as a line in each panel."""
    series: dict[str, list] = {}
    for r in res["results"]:
        if "tiers" in r:
            t = r["tiers"]
            series.setdefault(r["policy"], []).append(
                (t["total_bytes"] / 2**40, *(t["hit_rate_by_tier"][k] for k in ("L1", "L2", "L3"))))
    pols = list(series)                     # in --policy order
    fig, axes = plt.subplots(1, len(pols), figsize=(5.5 * len(pols), 4.5), sharey=True,
                             squeeze=False)
    colors = {"L1": "#4c72b0", "L2": "#dd8452", "L3": "#55a868"}
    for ax, pol in zip(axes[0], pols):
        for other in pols:
            pts = sorted(series[other])
            ax.plot([x for x, *_ in pts], [sum(v) for _, *v in pts], marker="o",
                    color="black" if other == pol else "gray",
                    linewidth=2 if other == pol else 1, linestyle="-" if other == pol else ":",
                    label=f"{other} (total)", zorder=3)
        for x, *v in sorted(series[pol]):
            bottom = 0.0
            for k, y in zip(("L1", "L2", "L3"), v):
                # (x / 1.2 to x * 1.2: centred on x on the log axis)
                ax.bar(x / 1.2, y, width=x * (1.2 - 1 / 1.2), bottom=bottom, align="edge",
                       color=colors[k], label=k if x == min(series[pol])[0] else None)
                bottom += y
        ax.axhline(res["ideal_hit_rate"], color="gray", linestyle="--",
                   label=f"ideal {res['ideal_hit_rate']:.3f}")
        ax.set_xscale("log")
        xs = sorted({x for x, *_ in series[pol]})
        ax.set_xticks(xs, [f"{x:.3g}" for x in xs])
        ax.minorticks_off()
        ax.set_title(pol)
        ax.set_xlabel(f"L1 + L2 + L3 bytes (TiB), {res['shape']} {res['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize=8, ncol=3)
    axes[0][0].set_ylabel("prompt tokens served from cache")
    axes[0][0].set_ylim(0, max(0.05, res["ideal_hit_rate"] * 1.4))
    fig.suptitle(f"{Path(res['trace']).name}: {res['requests']} requests, hit rate by tier")
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
