"""The plot of `bench agent`: left, the real runs (hit rate overall and on resumed turns,
TTFT p90); right, the simulator's resumed-turn hit rate per KV budget, hold on and off."""
from __future__ import annotations


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    real = {k: v for k, v in (res.get("real") or {}).items()
            if isinstance(v, dict) and v.get("hit_rate") is not None}
    names = list(real)
    xs = range(len(names))
    axes[0].bar([x - 0.2 for x in xs], [real[n]["hit_rate"] for n in names], 0.4,
                label="all turns")
    axes[0].bar([x + 0.2 for x in xs], [real[n]["resumed_hit_rate"] or 0 for n in names], 0.4,
                label="resumed turns")
    axes[0].set_xticks(list(xs), names, rotation=15, fontsize=8)
    axes[0].set_ylabel("cached prompt tokens / prompt tokens")
    axes[0].set_title(f"real servers, KV {res.get('real', {}).get('kv_bytes', 0) / 2**20:.0f} MiB")
    axes[0].legend(fontsize=8)
    axes[1].bar(list(xs), [real[n]["ttft_p90_s"] or 0 for n in names], 0.4, label="p90")
    axes[1].bar(list(xs), [real[n]["ttft_p50_s"] or 0 for n in names], 0.4, label="p50")
    axes[1].set_xticks(list(xs), names, rotation=15, fontsize=8)
    axes[1].set_ylabel("TTFT (s)")
    axes[1].legend(fontsize=8)
    axes[1].set_title("time to first token")
    for trace in ("synthetic", "mooncake"):
        for on in (True, False):
            rows = [r for r in res.get("sim") or () if r["trace"] == trace
                    and (r["tool_pause_hold_s"] > 0) == on]
            if rows:
                axes[2].plot([r["kv_budget_bytes"] / 2**30 for r in rows],
                             [r["resumed_hit_rate"] for r in rows], "o-" if on else "x--",
                             label=f"{trace}, hold {'on' if on else 'off'}")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("KV budget (GiB, MiMo-V2-Flash shapes)")
    axes[2].set_ylabel("hit rate on resumed turns")
    axes[2].set_title("simulator")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"bench agent on {res.get('cpu', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
