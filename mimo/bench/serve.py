"""serve: time to first token under each waiting-queue policy, replaying a Mooncake trace.

One real server per policy (`server.py` on 127.0.0.1, the prefix cache on), the same
requests for each: a Mooncake-format trace scaled to this machine. Each 512-token hash
block becomes `--block-tokens` synthetic token ids drawn from the hash id, so equal hash
prefixes are equal token prefixes and prefix sharing carries over; prompt and output
lengths scale by the same factor (`--output-scale` for outputs), arrivals by `--time-scale`.
Requests are streamed (`/v1/completions` with token-id prompts, greedy); TTFT is the time
to the first streamed token.

Reported per policy: TTFT p50/p90/p99 overall and for the shortest and longest thirds of
requests (by prompt length), throughput, cache hit rate (cached / prompt tokens, from the
usage the server reports) and the longest queue wait (`mimo_queue_wait_max_seconds`). The
aging bound of compute-aware: a request waits at most max_uncached / aging_per_second plus
the time to drain the work ahead of it, which is at most FCFS's longest wait on the same
trace; `within_aging_bound` checks that.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time

from . import add_trace_arg
from .server_process import ServerProcess

NAME = "serve"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="TTFT per waiting-queue policy on a replayed trace",
                              description=__doc__.split("\n\n")[0])
    add_trace_arg(p)
    p.add_argument("--policies", default="fcfs,compute-aware")
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--num-requests", type=int, default=80)
    p.add_argument("--start", type=int, default=0, help="first trace line to replay")
    p.add_argument("--block-tokens", type=int, default=16,
                   help="tokens per 512-token trace block (sets the length scale)")
    p.add_argument("--output-scale", type=float, default=None,
                   help="output length scale (default: block-tokens / 512)")
    p.add_argument("--max-output-tokens", type=int, default=24)
    p.add_argument("--time-scale", type=float, default=2.5,
                   help="multiply trace inter-arrival times (smaller: higher load)")
    p.add_argument("--aging-per-second", type=float, default=20.0,
                   help="compute-aware aging; scale it with the machine: a fraction of the "
                        "tokens/s it prefills (about 400 on 2 CPU cores)")
    p.add_argument("--kv-cache-memory", default="1GiB")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--server-args", default="", help="extra flags for server.py")
    p.add_argument("--plot", default=None, help="write TTFT distributions to this PNG")
    p.add_argument("--seed", type=int, default=0)
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def build_requests(rows, block_tokens: int, output_scale: float, max_out: int,
                   time_scale: float, vocab: tuple[int, int] = (100, 20000)) -> list[dict]:
    """Trace rows -> [{'at': seconds, 'prompt': ids, 'max_tokens': n}]. Block h's tokens
    depend only on h, so shared hash prefixes stay shared token prefixes."""
    t0 = rows[0]["timestamp"]
    blocks: dict[int, list[int]] = {}
    out = []
    for r in rows:
        n = max(1, math.ceil(r["input_length"] * block_tokens / 512))
        ids: list[int] = []
        for h in r["hash_ids"]:
            if h not in blocks:
                rnd = random.Random(h)
                blocks[h] = [rnd.randrange(*vocab) for _ in range(block_tokens)]
            ids.extend(blocks[h])
        out.append({"at": (r["timestamp"] - t0) / 1000 * time_scale, "prompt": ids[:n],
                    "max_tokens": max(1, min(max_out, round(r["output_length"] * output_scale)))})
    return out


async def _one(client, url: str, model: str, req: dict, t_start: float, rec: dict) -> None:
    await asyncio.sleep(max(0.0, t_start + req["at"] - time.perf_counter()))
    sent = time.perf_counter()
    body = {"model": model, "prompt": req["prompt"], "max_tokens": req["max_tokens"],
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    rec.update(prompt_tokens=len(req["prompt"]), ttft=None, cached=0, out=0)
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            rec["error"] = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and rec["ttft"] is None:
                rec["ttft"] = time.perf_counter() - sent
            if ev.get("usage"):
                rec["cached"] = ev["usage"]["prompt_tokens_details"]["cached_tokens"]
                rec["out"] = ev["usage"]["completion_tokens"]
    rec["e2e"] = time.perf_counter() - sent


async def _replay(url: str, reqs: list[dict], label: str) -> tuple[list[dict], float]:
    import httpx
    recs = [{} for _ in reqs]
    limits = httpx.Limits(max_connections=len(reqs) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_one(client, url, model, r, t0, rec))
                 for r, rec in zip(reqs, recs)]
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=10)
            _log(f"{label}: {len(tasks) - len(pending)}/{len(tasks)} done, "
                 f"{time.perf_counter() - t0:.0f}s")
        for t in tasks:
            t.result()
        errors = [r["error"] for r in recs if "error" in r]
        if errors:
            _log(f"{label}: {len(errors)} requests failed, first: {errors[0]}")
        return recs, time.perf_counter() - t0


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))], 4)


def summarize(recs: list[dict], wall: float) -> dict:
    ok = [r for r in recs if r.get("ttft") is not None]
    by_len = sorted(ok, key=lambda r: r["prompt_tokens"])
    third = max(1, len(by_len) // 3)

    def ttft(rs):
        xs = [r["ttft"] for r in rs]
        return {"p50": _pct(xs, 50), "p90": _pct(xs, 90), "p99": _pct(xs, 99)}
    prompt = sum(r["prompt_tokens"] for r in ok)
    return {"requests": len(recs), "errors": len(recs) - len(ok), "ttft": ttft(ok),
            "ttft_shortest_third": ttft(by_len[:third]),
            "ttft_longest_third": ttft(by_len[-third:]),
            "output_tokens_per_s": round(sum(r["out"] for r in ok) / wall, 2),
            "requests_per_s": round(len(ok) / wall, 3),
            "cache_hit_rate": round(sum(r["cached"] for r in ok) / max(prompt, 1), 4),
            "wall_s": round(wall, 2)}


def _plot(path: str, per_policy: dict[str, list[dict]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, recs in per_policy.items():
        xs = sorted(r["ttft"] for r in recs if r.get("ttft") is not None)
        axes[0].plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    axes[0].set(xlabel="TTFT (s)", ylabel="fraction of requests", title="TTFT distribution")
    axes[0].legend()
    names = list(per_policy)
    data = [[r["ttft"] for r in per_policy[n] if r.get("ttft") is not None] for n in names]
    axes[1].boxplot(data, tick_labels=names, showfliers=True)
    axes[1].set(ylabel="TTFT (s)", title="TTFT per policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def measure(args) -> dict:
    from .sim_cache import load_trace
    rows = load_trace(args.trace, limit=args.start + args.num_requests)[args.start:]
    if not rows:
        raise SystemExit(f"no requests in {args.trace} from line {args.start}")
    oscale = args.output_scale if args.output_scale is not None else args.block_tokens / 512
    reqs = build_requests(rows, args.block_tokens, oscale, args.max_output_tokens, args.time_scale)
    _log(f"{len(reqs)} requests over {reqs[-1]['at']:.1f}s, prompts "
         f"{min(len(r['prompt']) for r in reqs)}-{max(len(r['prompt']) for r in reqs)} tokens")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results, raw = {}, {}
    for pol in policies:
        _log(f"starting a server with --policy {pol}")
        srv = ServerProcess(["--model", args.model, "--policy", pol,
                             "--aging-per-second", str(args.aging_per_second),
                             "--kv-cache-memory", args.kv_cache_memory,
                             "--threads", str(args.threads), "--log-level", "warning",
                             *args.server_args.split()])
        try:
            recs, wall = asyncio.run(_replay(srv.url, reqs, pol))
            res = summarize(recs, wall)
            res["longest_queue_wait_s"] = round(srv.metric("mimo_queue_wait_max_seconds"), 3)
        finally:
            srv.stop()
        results[pol], raw[pol] = res, recs
        _log(f"{pol}: {json.dumps(res)}")
    out = {"bench": NAME, "trace": str(args.trace), "requests": len(reqs),
           "block_tokens": args.block_tokens, "time_scale": args.time_scale,
           "aging_per_second": args.aging_per_second, "policies": results}
    ok = all(r["ttft"]["p90"] for r in results.values())
    if ok and "fcfs" in results and "compute-aware" in results:
        f, c = results["fcfs"], results["compute-aware"]
        max_u = max(len(r["prompt"]) for r in reqs)
        bound = max_u / args.aging_per_second + f["longest_queue_wait_s"]
        out["compare"] = {
            "ttft_p90_ratio": round(c["ttft"]["p90"] / f["ttft"]["p90"], 3),
            "longest_third_p90_ratio": round(c["ttft_longest_third"]["p90"]
                                             / f["ttft_longest_third"]["p90"], 3),
            "aging_bound_s": round(bound, 3),
            "within_aging_bound": c["longest_queue_wait_s"] <= bound}
    if args.plot:
        _plot(args.plot, raw)
        out["plot"] = args.plot
    return out


def run(args) -> int:
    print(json.dumps(measure(args)), flush=True)
    return 0
