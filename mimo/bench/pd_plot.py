"""bench pd's figure: TTFT and inter-token latency p50/p90 per request kind, PD against
colocated, and the short requests' token timelines (when each token of each stream
arrived, with the long prefills' arrivals marked)."""
from __future__ import annotations

from .pd_workload import gaps, pct

COLORS = {"pd": "tab:blue", "colocated": "tab:orange"}


def _bars(ax, arms: dict[str, list[dict]], metric, title: str) -> None:
    kinds = ("short", "long")
    labels = [f"{k} p{q}" for k in kinds for q in (50, 90)]
    width = 0.8 / len(arms)
    for i, (name, recs) in enumerate(arms.items()):
        vals = []
        for k in kinds:
            xs = [x for r in recs if r.get("kind") == k and "error" not in r
                  for x in metric(r)]
            vals += [pct(xs, 50) or 0.0, pct(xs, 90) or 0.0]
        ax.bar([j + i * width for j in range(len(labels))], vals, width, label=name,
               color=COLORS.get(name))
    ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(labels))], labels)
    ax.set(title=title, ylabel="seconds")
    ax.legend()


def plot(path: str, arms: dict[str, list[dict]], out: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    _bars(axes[0], arms, lambda r: [r["ttft"]] if r.get("ttft") is not None else [],
          "time to first token")
    _bars(axes[1], arms, gaps, "inter-token latency")
    ax = axes[2]
    for name, recs in arms.items():
        first = True
        for r in recs:
            if r.get("kind") != "short" or not r.get("times"):
                continue
            t = r["times"]
            ax.plot(t, range(1, len(t) + 1), color=COLORS.get(name), lw=1,
                    label=name if first else None)
            first = False
    longs = [r["sent"] for r in next(iter(arms.values())) if r.get("kind") == "long"]
    for i, s in enumerate(longs):
        ax.axvline(s, color="grey", ls=":", lw=1, label="long prompt sent" if i == 0 else None)
    ax.set(title="short requests: tokens received", xlabel="seconds since start",
           ylabel="tokens")
    ax.legend(fontsize=8)
    ratio = out.get("kv_bytes_ratio")
    fig.suptitle(f"bench pd, {out['model']}, {out['threads_per_worker']} thread(s) per worker; "
                 f"same_tokens={out['same_tokens']}, KV bytes on the wire / full KV = "
                 f"{ratio if ratio is not None else 'n/a'}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
