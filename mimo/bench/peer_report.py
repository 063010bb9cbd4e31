"""bench peers' table: the issue's rows from each server's workload result, each as a fraction
of the machine's limits (model_cost's roofline), and mimo against the best peer per row; and
its plot."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from .model_cost import Limits, ModelCost
from .peer_load import Workload


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    higher_is_better: bool


ROWS = (
    Row("single_decode_tok_s", "1 stream: decode tok/s", True),
    Row("single_ttft_s", "1 stream: TTFT (s)", False),
    Row("concurrent_tok_s", "concurrent streams: aggregate tok/s", True),
    Row("concurrent_ttft_median_s", "concurrent streams: median TTFT (s)", False),
    Row("cold_ttft_s", "long prompt, cold: TTFT (s)", False),
    Row("repeat_ttft_s", "the same prompt again: TTFT (s)", False),
    Row("shared_prefix_ttft_s", "long prompt sharing a prefix: TTFT (s)", False),
)


def figures(load: dict) -> dict[str, float | None]:
    """The row values of one server's workload result (None where a part failed)."""
    a, b = load.get("a_single") or {}, load.get("b_concurrent") or {}
    c, d = load.get("c_repeat") or {}, load.get("d_shared_prefix") or {}
    return {"single_decode_tok_s": a.get("decode_tok_s"), "single_ttft_s": a.get("ttft_s"),
            "concurrent_tok_s": b.get("aggregate_tok_s"),
            "concurrent_ttft_median_s": b.get("ttft_s_median"),
            "cold_ttft_s": c.get("ttft_first_s"), "repeat_ttft_s": c.get("ttft_second_s"),
            "shared_prefix_ttft_s": d.get("ttft_second_s")}


def cached_tokens(load: dict) -> dict[str, int | None]:
    c, d = load.get("c_repeat") or {}, load.get("d_shared_prefix") or {}
    return {"repeat_ttft_s": c.get("cached_tokens_second"),
            "shared_prefix_ttft_s": d.get("cached_tokens_second")}


def _n(x, default: int) -> int:
    """A reported token count (of a pair: the second request's), else the workload's."""
    x = x[-1] if isinstance(x, list) else x
    return int(x) if x else default


def bounds(load: dict, w: Workload, cost: ModelCost, lim: Limits) -> dict[str, dict]:
    """Per row, the roofline time of its unit: one output token for the rates, the request's
    TTFT for the times. Prompt lengths are the server's own count where it reports one."""
    a, c, d = load.get("a_single") or {}, load.get("c_repeat") or {}, load.get("d_shared_prefix") or {}
    p = _n(a.get("prompt_tokens"), w.prompt_tokens)
    mid = p + w.max_tokens // 2                   # a decode token's mean position
    n = w.concurrency
    one = cost.decode_step_time([mid], lim)
    batch = {k: v / n for k, v in cost.decode_step_time([mid] * n, lim).items()}
    pre = cost.prefill_time(0, p, lim)
    # The best schedule for the median TTFT of n equal prompts prefills them one by one:
    # the k-th answers after k prefills.
    med = statistics.median(range(1, n + 1))
    cached = cached_tokens(load)

    def long(part: dict, key: str) -> dict:
        total = _n(part.get("prompt_tokens"), w.long_tokens)
        hit = min(int(cached.get(key) or 0), total - 1)
        return cost.prefill_time(hit, total, lim)

    return {"single_decode_tok_s": one, "single_ttft_s": pre, "concurrent_tok_s": batch,
            "concurrent_ttft_median_s": {k: v * med for k, v in pre.items()},
            "cold_ttft_s": cost.prefill_time(0, _n((c.get("prompt_tokens") or [0])[0], w.long_tokens), lim),
            "repeat_ttft_s": long(c, "repeat_ttft_s"),
            "shared_prefix_ttft_s": long(d, "shared_prefix_ttft_s")}


def fractions(value: float | None, bound: dict, higher: bool) -> dict | None:
    """How close a figure comes to each limit: rate x bound time, or bound time / time."""
    if not value:
        return None
    f = (lambda s: float(f"{value * s:.3g}")) if higher else (lambda s: float(f"{s / value:.3g}"))
    return {"memory": f(bound["memory_s"]), "compute": f(bound["compute_s"]),
            "roofline": f(bound["bound_s"])}


def median_of_rounds(values: list[float | None]) -> float | None:
    """A row's value over a server's rounds: their median; None if a round has none."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def table(loads: dict[str, list[dict]], w: Workload, cost: ModelCost, lim: Limits,
          read: dict[str, list[float]] | None = None) -> dict:
    """Every row: each server's value (the median of its rounds' workload results, each
    round's kept under values_by_round when there are several), cached tokens, fractions of
    the limits, and mimo against the best peer (the servers other than 'mimo' with a value).
    Bounds and cached tokens come from the last round (each round sends the same sizes).
    With `read` (per server, the read rate next to each of its turns, bytes/s) each row also
    has memory_fraction_by_turn: per server the median of its rounds' memory fractions
    against those rates (each round's under memory_fraction_by_round)."""
    figs = {s: [figures(ld) for ld in lds] for s, lds in loads.items()}
    last = {s: lds[-1] for s, lds in loads.items()}
    bnds = {s: bounds(ld, w, cost, lim) for s, ld in last.items()}
    # each round's bounds against the read rate next to its turn
    turn_bnds = None if read is None else {
        s: [bounds(ld, w, cost, Limits(bw, lim.matmul_flops)) for ld, bw in zip(lds, read[s], strict=True)]
        for s, lds in loads.items()}
    several = any(len(lds) > 1 for lds in loads.values())
    rows = {}
    for r in ROWS:
        vals = {s: median_of_rounds([f[r.key] for f in fs]) for s, fs in figs.items()}
        row: dict[str, Any] = {
            "label": r.label, "better": "higher" if r.higher_is_better else "lower",
            "values": vals,
            "fraction_of_limit": {s: fractions(v, bnds[s][r.key], r.higher_is_better)
                                  for s, v in vals.items()}}
        if several:
            row["values_by_round"] = {s: [f[r.key] for f in fs] for s, fs in figs.items()}
        if turn_bnds is not None:
            by = {s: [None if f is None else f["memory"] for f in
                      (fractions(fig[r.key], b[r.key], r.higher_is_better)
                       for fig, b in zip(figs[s], turn_bnds[s]))]
                  for s in loads}
            row["memory_fraction_by_turn"] = {s: median_of_rounds(v) for s, v in by.items()}
            if several:
                row["memory_fraction_by_round"] = by
        if r.key in ("repeat_ttft_s", "shared_prefix_ttft_s"):
            row["cached_tokens"] = {s: cached_tokens(ld)[r.key] for s, ld in last.items()}
        row |= compare(vals, r.higher_is_better)
        rows[r.key] = row
    return rows


def compare(vals: dict[str, float | None], higher: bool) -> dict:
    """mimo / best peer, which peer is best, and whether mimo matches or beats it (>= 1.0 in
    speed terms: a rate's ratio, a time's inverse ratio)."""
    peers: dict[str, float] = {s: v for s, v in vals.items() if s != "mimo" and v}
    mimo = vals.get("mimo")
    if not peers or not mimo:
        return {"best_peer": None, "best_peer_value": None, "mimo_over_best": None,
                "mimo_speedup_vs_best": None, "mimo_matches_or_beats": None}
    best = (max if higher else min)(peers, key=lambda s: peers[s])
    ratio = mimo / peers[best]
    speedup = ratio if higher else 1.0 / ratio
    return {"best_peer": best, "best_peer_value": peers[best], "mimo_over_best": round(ratio, 4),
            "mimo_speedup_vs_best": round(speedup, 4), "mimo_matches_or_beats": speedup >= 1.0}


def summary(rows: dict) -> dict:
    verdicts = [r["mimo_matches_or_beats"] for r in rows.values()
                if r["mimo_matches_or_beats"] is not None]
    return {"rows_compared": len(verdicts), "rows_mimo_matches_or_beats": sum(verdicts),
            "rows_mimo_ahead": sum(1 for r in rows.values()
                                   if (r["mimo_speedup_vs_best"] or 0) > 1.0),
            "mimo_matches_or_beats_every_row": (all(verdicts) and len(verdicts) == len(rows))
            if verdicts else None}


def plot(res: dict, path: str) -> None:
    """Left: each server's speed relative to the row's best server (1 = best). Right: each
    figure as a fraction of the machine's roofline."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["rows"]
    servers = [s for s in res["servers"] if res["servers"][s].get("status") == "ok"]
    keys = list(rows)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    h = 0.8 / max(1, len(servers))
    for j, s in enumerate(servers):
        rel, frac = [], []
        for k in keys:
            vals = [v for v in rows[k]["values"].values() if v]
            v = rows[k]["values"].get(s)
            best = (max if rows[k]["better"] == "higher" else min)(vals) if vals else None
            rel.append(0 if not v or not best else
                       (v / best if rows[k]["better"] == "higher" else best / v))
            f = rows[k]["fraction_of_limit"].get(s)
            frac.append(f["roofline"] if f else 0)
        ys = [i + j * h for i in range(len(keys))]
        axes[0].barh(ys, rel, h, label=s)
        axes[1].barh(ys, frac, h, label=s)
    axes[0].set_yticks([i + 0.4 - h / 2 for i in range(len(keys))],
                       [rows[k]["label"] for k in keys])
    axes[0].invert_yaxis()
    axes[0].axvline(1.0, color="k", lw=0.8)
    axes[0].set_xlabel("speed relative to the row's best server (1 = best)")
    axes[1].set_xlabel("fraction of the machine's roofline")
    if servers:
        axes[0].legend(loc="lower right", fontsize=8)
    m = res["machine"]
    fig.suptitle(f"bench peers: {res['model']}; matmul {m['matmul_gflops']} GFLOP/s, "
                 f"memory {m['bandwidth_gbs']} GB/s, {m['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
