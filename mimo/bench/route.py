"""route: the cache-aware router against round-robin, the same workers and workloads.

For every workload, each router gets fresh workers (`server.py --router-redis`, empty
caches) and a fresh Redis; the workload is streamed through it and every request's worker,
usage and TTFT recorded. The reference is one worker with all the workers' memory, no router.
Workloads: `shared` (sessions x turns sharing one system prompt), `distinct` (each session
its own), `trace` (every k-th multi-turn conversation of the Mooncake conversation trace,
lengths scaled by --block-tokens / 512, arrivals spread over --trace-duration).
Routers: round-robin (mimo.router --policy round-robin: the same proxy, no affinity), mimo
(cache-aware), and, when installed (--sglang-router / --vllm-router, or on PATH),
sglang-router and vllm-router in cache_aware mode; with those the whole bench runs inside a
loopback-only network namespace (route_netns.py), and a router not installed or not runnable
is listed as such under "third_party".

Reported per workload and router: the cached-token fraction (cached / prompt tokens from the
workers' usage), the share of turns on the previous turn's worker, max/mean requests per
worker, TTFT p50/p90, mimo's predicted over actual cached tokens; one JSON line last.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

from . import add_trace_arg, route_netns
from .route_load import WORDS, conversations, log, run_sessions, run_trace, sessions
from .router_process import RouterProcess, WorkerProcess, start_all

NAME = "route"
WORKLOADS = ("shared", "distinct", "trace")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="cache-aware router vs round-robin on 4 workers",
                              description=__doc__.split("\n\n")[0])
    add_trace_arg(p)
    p.add_argument("--model", default="tiny",
                   help="tiny (a random tiny Gemma 3, written to a temporary directory), or "
                        "what server.py --model takes")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2,
                   help="rounds per workload, the routers alternating; figures are medians")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--routers", default="round-robin,mimo,sglang,vllm",
                   help="routers compared (sglang and vllm: when installed)")
    p.add_argument("--sglang-router", default=None, metavar="PATH",
                   help="sglang-router's executable (default: on PATH)")
    p.add_argument("--vllm-router", default=None, metavar="PATH",
                   help="vllm-router's executable (default: on PATH)")
    p.add_argument("--netns", default="mimo-route", metavar="NAME",
                   help="the loopback-only network namespace the bench runs in when a "
                        "third-party router runs (made if absent; needs root)")
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--system-words", type=int, default=120)
    p.add_argument("--user-words", type=int, default=30)
    p.add_argument("--session-gap", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between session starts, as users arrive (0: every session's "
                        "first, cold turn at once: a burst that no router can shorten, which "
                        "then sets every router's TTFT p90)")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--trace-requests", type=int, default=200,
                   help="about this many requests replayed: every k-th multi-turn "
                        "conversation of the trace, k chosen to give them")
    p.add_argument("--trace-duration", type=float, default=180.0,
                   help="seconds the replayed slice's arrivals are spread over")
    p.add_argument("--block-tokens", type=int, default=16,
                   help="tokens per 512-token trace block (the length scale)")
    p.add_argument("--kv-cache-memory", default="6MiB", help="per worker")
    p.add_argument("--reference-memory", default=None,
                   help="the reference worker's KV memory (default: workers x per worker)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--worker-args", default="", metavar="FLAGS",
                   help="extra server.py flags for every worker and the reference (one "
                        "string, e.g. --worker-args=\"--swa-share 0.6\")")
    p.add_argument("--router-args", default="", metavar="FLAGS",
                   help="extra mimo.router flags for mimo's router (one string, e.g. "
                        "--router-args=\"--match-weight 2\")")
    p.add_argument("--worker-nice", type=int, default=5,
                   help="niceness of the worker processes: on a machine with fewer cores than "
                        "workers, the router and the clients (a deployment gives the router "
                        "its own core) are not starved by the workers' compute (0: off)")
    p.add_argument("--start-timeout", type=float, default=180.0, metavar="SECONDS",
                   help="longest a worker or router may take to answer /health at start")
    p.add_argument("--trace-prompts", choices=("text", "ids"), default="text",
                   help="trace prompts as text (each synthetic token one of a few words "
                        "that the tokenizer keeps as one token each, so shared blocks stay "
                        "shared tokens: every router takes them) or as token-id arrays "
                        "(sglang-router 0.3.2 answers those with HTTP 422)")
    p.add_argument("--max-prompt", type=int, default=3500,
                   help="trace prompts are cut to this many tokens (the model's context)")
    p.add_argument("--records", default=None,
                   help="append every run's per-request records (JSON lines) to this file")
    p.add_argument("--plot", default=None, help="write the figures to this PNG")
    return p


def _mib(text: str) -> float:
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = {"k": 1 / 1024, "m": 1, "g": 1024}.get(t[-1:], None)
    return float(t[:-1]) * mult if mult is not None else float(t) / 2**20


def _pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return round(xs[min(len(xs) - 1, max(0, -(-len(xs) * q // 100) - 1))], 4)


def _continues(r: dict) -> bool:
    return r["prev"] is not None if "prev" in r else r.get("turn", 0) > 0


def summarize(recs: list[dict], workers: list[str] | None,
              counts: dict[str, float] | None = None) -> dict:
    """`counts`: requests per worker as the workers counted them (else from the records'
    worker header)."""
    ok = [r for r in recs if "error" not in r]
    prompt = sum(r["prompt"] for r in ok)
    out = {"requests": len(recs), "errors": len(recs) - len(ok),
           "cached_fraction": round(sum(r["cached"] for r in ok) / max(prompt, 1), 4),
           "ttft_p50": _pct([r["ttft"] for r in ok], 50),
           "ttft_p90": _pct([r["ttft"] for r in ok], 90),
           # Requests that continue an earlier one (a session's later turns, a trace
           # request with a parent): what affinity can speed up. A workload's first wave is
           # cold on every router and, at 1 request in 10, sits right at the p90.
           "ttft_p90_continued": _pct([r["ttft"] for r in ok if _continues(r)], 90)}
    if workers and counts is None and ok and all(r.get("worker") is None for r in ok):
        return out      # no router said where a request went, and no worker counted
    if workers:
        if counts is None:
            counts = {w: 0 for w in workers}
            for r in ok:
                counts[r["worker"]] = counts.get(r["worker"], 0) + 1
        out["max_over_mean"] = round(max(counts.values()) * len(counts) /
                                     max(sum(counts.values()), 1), 3)
        if any(r.get("worker") is None for r in ok):
            # The router does not say which worker answered (third-party ones): the counts
            # are the workers' own, the turn-to-turn share is not observable.
            out["same_worker_share"] = None
            out["requests_per_worker"] = sorted(counts.values(), reverse=True)
            return out
        by_key = {(r.get("session"), r.get("turn")): r for r in ok}
        pairs = []
        for r in ok:
            if "prev" in r:
                prev = recs[r["prev"]] if r["prev"] is not None else None
            else:
                prev = by_key.get((r["session"], r["turn"] - 1))
            if prev is not None and "error" not in prev:
                pairs.append(prev["worker"] == r["worker"])
        out["same_worker_share"] = round(sum(pairs) / max(len(pairs), 1), 4)
    return out


def _workload(args, name: str, tok_dir: str):
    if name in ("shared", "distinct"):
        convs = sessions(args.sessions, args.turns, name == "shared", args.system_words,
                         args.user_words)
        return lambda url: run_sessions(url, tok_dir, convs, args.max_tokens, args.session_gap)
    from .serve import build_requests
    from .sim_cache import load_trace
    rows, parents = conversations(load_trace(args.trace), args.trace_requests)
    vocab = (10, 500) if args.model == "tiny" else (100, 20000)
    span = max(rows[-1]["timestamp"] - rows[0]["timestamp"], 1) / 1000
    reqs = build_requests(rows, args.block_tokens, args.block_tokens / 512, args.max_tokens,
                          args.trace_duration / span, vocab)
    for r in reqs:
        del r["prompt"][args.max_prompt:]
        if args.trace_prompts == "text":
            r["prompt"] = " ".join(WORDS[t % len(WORDS)] for t in r["prompt"])
    return lambda url: run_trace(url, tok_dir, reqs, parents)


def _one_run(args, model: str, work, router: str | None) -> dict:
    from .redis_process import RedisServer
    redis = RedisServer() if router is not None else None
    # The tiny random model runs in float32 (its numerics are the tests'); a real model at
    # the server's defaults, as a user would serve it.
    base = (["--model", model, "--threads", str(args.threads), "--served-model-name", model,
             "--metrics-public"] + (["--dtype", "float32"] if args.model == "tiny" else []))
    n = args.workers if router is not None else 1
    mem = args.kv_cache_memory if router is not None else (
        args.reference_memory or f"{_mib(args.kv_cache_memory) * args.workers:g}MiB")
    flags = base + ["--kv-cache-memory", mem] + shlex.split(args.worker_args)
    if redis is not None:
        flags += ["--router-redis", redis.url, "--router-heartbeat", "0.25"]
    ws = rt = None
    try:
        ws = start_all(lambda i, wait: WorkerProcess(flags, args.start_timeout, wait=wait,
                                                     nice=args.worker_nice), n)
        url = ws[0].url
        if router in args.third_party_exe:
            rt = route_netns.start_router(router, args.third_party_exe[router],
                                          [w.url for w in ws], args.start_timeout)
            url = rt.url
        elif router is not None:
            rflags = ["--model", model, "--redis", redis.url, "--health-interval", "0.5",
                      "--policy", "round-robin" if router == "round-robin" else "cache-aware"]
            if router == "mimo":
                rflags += shlex.split(args.router_args)
            for w in ws:
                rflags += ["--worker", w.url]
            rt = RouterProcess(rflags, args.start_timeout)
            url = rt.url
            import time
            time.sleep(1.0)         # the workers' first heartbeats are in
        recs = asyncio.run(work(url))
        if args.records:
            with open(args.records, "a") as f:
                f.write(json.dumps({"router": router, "records": recs}) + "\n")
        counts = ({w.url: worker_requests(w.url) for w in ws}
                  if router in args.third_party_exe else None)
        res = summarize(recs, [w.url for w in ws] if router is not None else None, counts)
        if res["errors"]:
            for w in ws:
                log(f"worker {w.url} log tail:\n{w.log_tail(2000)}")
        if rt is not None and router == "mimo":
            m = rt.counters()
            pred = sum(m.get("mimo_router_measured_predicted_tokens_total", {}).values())
            act = sum(m.get("mimo_router_actual_cached_tokens_total", {}).values())
            res["predicted_over_actual"] = round(pred / act, 4) if act else None
            res["decisions"] = m.get("mimo_router_decisions_total", {})
            n = sum(m.get("mimo_router_decision_seconds_count", {}).values())
            res["decision_ms_mean"] = round(1000 * sum(
                m.get("mimo_router_decision_seconds_sum", {}).values()) / max(n, 1), 2)
        return res
    finally:
        for p in ([rt] if rt else []) + (ws or []):
            p.stop()
        if redis is not None:
            redis.stop()


def worker_requests(url: str) -> float:
    """Generation requests a mimo worker finished (its /metrics: --metrics-public)."""
    import httpx
    n = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("mimo_requests_total{"):
            n += float(line.rsplit(" ", 1)[1])
    return n


def measure(args) -> dict:
    if not hasattr(args, "third_party_exe"):
        args.third_party_exe = {}
    tmp = None
    model = args.model
    if model == "tiny":
        from ..models.tiny import gemma3
        tmp = tempfile.mkdtemp(prefix="mimo-route-tiny-")
        gemma3.write(Path(tmp), seed=3)
        model = tmp
    routers = [r for r in args.routers.split(",")
               if r and (r not in route_netns.THIRD_PARTY or r in args.third_party_exe)]
    out: dict = {"model": args.model, "workers": args.workers,
                 "worker_args": args.worker_args, "session_gap": args.session_gap,
                 "trace_prompts": args.trace_prompts, "router_args": args.router_args,
                 "results": {}}
    for wl in [w for w in args.workloads.split(",") if w]:
        if wl not in WORKLOADS:
            raise SystemExit(f"unknown workload {wl!r} (choose from {', '.join(WORKLOADS)})")
        work = _workload(args, wl, model)
        runs: dict[str, list[dict]] = {"one_worker": [], **{r: [] for r in routers}}
        pairs: list[float] = []
        for rep in range(args.repeats):
            # Rounds alternate the routers (the reference first, order reversed every other
            # round), so a machine shared with other jobs loads them alike.
            order = ["one_worker"] + (routers if rep % 2 == 0 else routers[::-1])
            for r in order:
                try:
                    runs[r].append(_one_run(args, model, work,
                                            None if r == "one_worker" else r))
                except Exception as e:  # noqa: BLE001 - a third-party router that fails
                    if r not in route_netns.THIRD_PARTY:
                        raise
                    runs[r].append({"failed": f"{type(e).__name__}: {e}"[:600]})
                log(f"{wl}: {r} (round {rep + 1}): {json.dumps(runs[r][-1])}")
            if "mimo" in runs and "round-robin" in runs and runs["round-robin"][-1]["ttft_p90"]:
                pairs.append(runs["mimo"][-1]["ttft_p90"] / runs["round-robin"][-1]["ttft_p90"])
        res: dict[str, Any] = {r: _median_run(v) for r, v in runs.items()}
        m, rr = res.get("mimo") or {}, res.get("round-robin") or {}
        if m.get("ttft_p90_continued") and rr.get("ttft_p90_continued"):
            # Not a target (the is the p90 of all requests): the same ratio over the
            # requests affinity can help.
            res["continued_ttft_p90_mimo_over_rr"] = round(
                m["ttft_p90_continued"] / rr["ttft_p90_continued"], 4)
        if pairs:
            res["ttft_p90_ratio_per_round"] = [round(x, 4) for x in pairs]
        out["results"][wl] = res
    out["targets"] = targets(out["results"])
    return out


def _median_run(runs: list[dict]) -> dict:
    """Each numeric figure's median over the rounds (the rest from the first round)."""
    import statistics
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and all(isinstance(r.get(k), (int, float)) for r in runs):
            out[k] = round(statistics.median(r[k] for r in runs), 4)
    out["rounds"] = len(runs)
    return out


def targets(results: dict) -> dict:
    t: dict = {}
    for wl, res in results.items():
        m, rr, one = res.get("mimo"), res.get("round-robin"), res.get("one_worker")
        if m is None:
            continue
        if one:
            t[f"{wl}_cached_vs_one_worker"] = round(m["cached_fraction"] /
                                                    max(one["cached_fraction"], 1e-9), 4)
        if res.get("ttft_p90_ratio_per_round"):
            import statistics
            t[f"{wl}_ttft_p90_vs_round_robin"] = round(
                statistics.median(res["ttft_p90_ratio_per_round"]), 4)
        elif rr and rr.get("ttft_p90"):
            t[f"{wl}_ttft_p90_vs_round_robin"] = round(m["ttft_p90"] / rr["ttft_p90"], 4)
        sg = res.get("sglang")
        if sg and sg.get("cached_fraction"):
            t[f"{wl}_cached_vs_sglang"] = round(m["cached_fraction"] / sg["cached_fraction"], 4)
        if wl == "shared":
            t["shared_max_over_mean"] = m["max_over_mean"]
        if m.get("predicted_over_actual") is not None:
            t[f"{wl}_predicted_over_actual"] = m["predicted_over_actual"]
    t["met"] = (all(v >= 0.95 for k, v in t.items() if k.endswith("_vs_one_worker"))
                and all(v <= 0.7 for k, v in t.items() if k.endswith("_vs_round_robin"))
                and all(v >= 1.0 for k, v in t.items() if k.endswith("_vs_sglang"))
                and t.get("shared_max_over_mean", 0) <= 1.3
                and all(abs(v - 1) <= 0.05 for k, v in t.items()
                        if k.endswith("_predicted_over_actual")))
    return t


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    wls = list(res["results"])
    first = next(iter(res["results"].values()))
    routers = ["one_worker"] + [r for r, v in first.items()
                                if r != "one_worker" and isinstance(v, dict)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, title in zip(axes, ("cached_fraction", "ttft_p90", "max_over_mean"),
                              ("cached-token fraction", "TTFT p90 (s)", "max/mean requests")):
        w = 0.8 / len(routers)
        for j, r in enumerate(routers):
            vals = [res["results"][wl].get(r, {}).get(key) or 0 for wl in wls]
            ax.bar([i + j * w for i in range(len(wls))], vals, w, label=r)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(wls))], wls)
        ax.set_title(title)
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle(f"bench route: {res['workers']} workers, model {res['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # Before the workers run, not after half an hour of them.
        raise SystemExit("--plot needs matplotlib (pip install -e '.[bench]')")
    third: dict[str, dict] = {}
    exe: dict[str, str] = {}
    for r in [r for r in args.routers.split(",") if r in route_netns.THIRD_PARTY]:
        path = route_netns.find(r, getattr(args, f"{r}_router"))
        third[r] = {"status": "not installed"} if path is None else {"path": path}
        if path is not None:
            exe[r] = path
    if exe and not route_netns.inside(args.netns):
        why = route_netns.ensure(args.netns)
        if why is None:
            log(f"third-party routers {sorted(exe)}: running the bench in network "
                f"namespace {args.netns!r}")
            return route_netns.reexec(args.netns)
        for r in exe:
            third[r]["status"] = f"not run: {why}"
        exe = {}
    args.third_party_exe = exe
    res = measure(args)
    for r in exe:
        failed = [res["results"][wl][r]["failed"] for wl in res["results"]
                  if "failed" in res["results"][wl].get(r, {})]
        third[r]["status"] = f"failed: {failed[0]}" if failed else "run"
    res["third_party"] = third
    if route_netns.inside(args.netns):
        res["netns"] = {"name": args.netns, "interfaces": route_netns.links()}
    if args.plot:
        plot(res, args.plot)
        log(f"plot: {args.plot}")
    print(json.dumps(res))
    return 0
