"""pd: disaggregated prefill/decode against colocated workers, on one mixed workload.

Two arms, the same seeded requests (`pd_workload`: long prefills arriving while short
requests decode), real processes on 127.0.0.1, one after the other:

- pd: one `server.py --role prefill` and one `--role decode` worker behind
  `python -m mimo.router --prefill URL --decode URL`;
- colocated: two `server.py` (`--role both`) workers behind `python -m mimo.router
  --worker URL --worker URL` (the same worker count).

Each worker gets `--threads` torch threads (default 1: two workers on two cores) and
`--server-args` (default float32, no quantization). One warm-up request per arm is not
counted. Reported per arm: TTFT and inter-token latency p50/p90 (all requests, and per
kind) and the machine's load average; for pd the KV transfers of the timed run from the
workers' /v1/internal/kv_transfers: bytes on the wire against a full-KV layout of the same
prompts (`kv_bytes_ratio`), transfers that failed into a recompute, and the time spent
sending against prefill time. After the colocated arm, every request runs again alone on
one of its workers (its own cache namespace: no hits): the single-worker reference.
`same_tokens`: every pd answer equals the reference in text and token count, greedy
(`colocated_same_tokens` likewise; `differing` lists the requests that do not). Pools are
checked whole and idle on every worker after each arm (/metrics). Last, for a model of a
known shape, one long prompt's KV is moved over the direct stream and over the Redis tier
path (`pd_transport`, `--transport-reps`; redis-server on PATH): `transport` in the JSON.

    python -m mimo.bench pd [--model gemma-3-270m] [--plot docs/pd.png] [--quick]

`--quick` runs a tiny random MiMo-V2-Flash (written to a temporary directory) on a small
workload: for the test, not a measurement. Progress on stderr; one JSON line last on
stdout, naming the CPU and its instruction sets.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .pd_workload import (
    Workload,
    replay,
    requests,
    same_tokens,
    sequential,
    summarize,
    transfer_figures,
)

NAME = "pd"
STATS = "/v1/internal/kv_transfers"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="PD (prefill + decode worker) vs two colocated "
                                         "workers: TTFT, inter-token latency, KV bytes",
                              description=__doc__.split("\n\n")[0])
    w = Workload()
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--quick", action="store_true",
                   help="tiny random MiMo-V2-Flash and a small workload (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--kv-cache-memory", default="512MiB")
    p.add_argument("--server-args", default="--dtype float32 --quantize none",
                   help="extra flags for every server.py (default: float32 without "
                        "quantization, under which answers do not depend on what they were "
                        "batched with, so same_tokens can hold; \"\" for the defaults)")
    p.add_argument("--kv-transfer-timeout", type=float, default=600.0,
                   help="the decode worker's --kv-transfer-timeout (default 600: a prompt "
                        "queued behind long prefills on a loaded machine is not given up)")
    for f in dataclasses.fields(Workload):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(w, f.name)),
                       default=None, help=f"workload: {f.name} (default {getattr(w, f.name)})")
    p.add_argument("--transport-reps", type=int, default=3,
                   help="also move one long prompt's KV over the direct stream and the Redis "
                        "tier path (bench pd-transport) this many times; 0: skip (skipped for "
                        "a model without a known shape)")
    p.add_argument("--plot", default=None, help="write the figure to this PNG")
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def _workload(args) -> Workload:
    base = (Workload(short=3, short_lo=16, short_hi=40, short_max_tokens=12, short_gap=0.3,
                     long=2, long_tokens=160, long_max_tokens=4, long_gap=0.5, vocab_lo=10,
                     vocab_hi=250) if args.quick else Workload())
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Workload)
             if getattr(args, f.name, None) is not None}
    return dataclasses.replace(base, **given)


def pool_pages(url: str) -> dict[str, dict[str, int]]:
    """{pool: {state: pages}} from a worker's /metrics (--metrics-public)."""
    import httpx
    out: dict[str, dict[str, int]] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("mimo_kv_pool_pages{"):
            labels, value = line.split("} ")
            kv = dict(x.split("=") for x in labels[len("mimo_kv_pool_pages{"):].split(","))
            out.setdefault(kv["pool"].strip('"'), {})[kv["state"].strip('"')] = int(float(value))
    return out


def pools_idle(url: str, timeout: float = 10.0) -> bool:
    """Every pool whole (free + evictable + in_use == capacity) with nothing in use."""
    until = time.time() + timeout
    while True:
        p = pool_pages(url)
        ok = bool(p) and all(v["free"] + v["evictable"] + v["in_use"] == v["capacity"]
                             and v["in_use"] == 0 for v in p.values())
        if ok or time.time() > until:
            return ok
        time.sleep(0.2)


def _stats(url: str) -> dict:
    import httpx
    return httpx.get(url + STATS, timeout=10).json()


def _arm(name: str, args, model: str, reqs: list[dict], warm: dict) -> dict:
    """Start an arm's two workers and router, run the warm-up and the workload; its records,
    summary and (pd) transfer figures."""
    from .router_process import RouterProcess, WorkerProcess, start_all
    base = ["--model", model, "--threads", str(args.threads), "--kv-cache-memory",
            args.kv_cache_memory, "--metrics-public", "--log-level", "warning",
            *args.server_args.split()]
    roles = ["prefill", "decode"] if name == "pd" else ["both", "both"]
    _log(f"{name}: starting workers ({', '.join(roles)})")
    extra = {"decode": ["--kv-transfer-timeout", str(args.kv_transfer_timeout)]}
    workers = start_all(lambda i, wait: WorkerProcess(
        base + ["--role", roles[i], *extra.get(roles[i], [])], wait=wait), 2)
    router = None
    try:
        flags = (["--prefill", workers[0].url, "--decode", workers[1].url] if name == "pd"
                 else ["--worker", workers[0].url, "--worker", workers[1].url])
        router = RouterProcess(["--model", model, "--health-interval", "0.5",
                                "--log-level", "warning", *flags])
        asyncio.run(replay(router.url, [warm], f"{name} warm-up", _log))
        before = [_stats(w.url) for w in workers] if name == "pd" else None
        load0 = os.getloadavg()[0]
        recs = asyncio.run(replay(router.url, reqs, name, _log))
        res = summarize(recs)
        # The machine's 1-minute load average before and after: other work on the same
        # cores shows here, and skews both arms' latencies.
        res["load_avg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        if before is not None:
            after = [_stats(w.url) for w in workers]
            res["transfer"] = transfer_figures(before[0], after[0], before[1], after[1])
        res["pools_idle"] = all(pools_idle(w.url) for w in workers)
        res["served_by"] = sorted({r.get("worker") or "" for r in recs})
        res["workers"] = [w.url for w in workers]
        _log(f"{name}: {json.dumps(res)}")
        out = {"summary": res, "records": recs}
        if name == "colocated":     # the reference: each request alone on one worker
            out["reference"] = asyncio.run(sequential(workers[0].url, reqs, "reference",
                                                      _log))
        return out
    finally:
        for p in (router, *workers):
            if p is not None:
                p.stop()


def _kv_dtype(shape: str, full_kv_bytes: int, tokens: int) -> str:
    """The workers' KV dtype, from the full-KV bytes they counted for `tokens` tokens."""
    from ..kvcache.kv_payload import full_kv_bytes as per
    from ..kvcache.pool.layout import shape_layout
    f32 = per(shape_layout(shape, "float32"), tokens)
    return "float32" if full_kv_bytes == f32 else "bfloat16"


def measure(args) -> dict:
    w = _workload(args)
    reqs = requests(w)
    warm = {**requests(dataclasses.replace(w, seed=w.seed + 1000, short=0, long=1))[0],
            "at": 0.0}
    tmp = None
    model = args.model
    if args.quick:
        from ..models.tiny import mimo_v2_flash
        tmp = tempfile.TemporaryDirectory(prefix="bench_pd_")
        mimo_v2_flash.write(Path(tmp.name), seed=1)
        model = tmp.name
    shown = "tiny MiMo-V2-Flash" if args.quick else args.model
    _log(f"{len(reqs)} requests over {reqs[-1]['at']:.1f} s on {shown}")
    try:
        arms = {name: _arm(name, args, model, reqs, warm) for name in ("pd", "colocated")}
    finally:
        if tmp is not None:
            tmp.cleanup()
    ref = arms["colocated"]["reference"]
    same, differ = same_tokens(arms["pd"]["records"], ref)
    co_same, co_differ = same_tokens(arms["colocated"]["records"], ref)
    from ..cpu.features import cpu_info
    info = cpu_info()
    t = arms["pd"]["summary"].get("transfer", {})
    out = {"bench": NAME, "model": "tiny-mimo-v2-flash" if args.quick else args.model,
           "threads_per_worker": args.threads, "workload": dataclasses.asdict(w),
           "same_tokens": same, "colocated_same_tokens": co_same,
           "differing": {"pd": differ, "colocated": co_differ},
           "kv_bytes_ratio": t.get("kv_bytes_ratio"),
           "transfer_fraction": t.get("transfer_fraction"),
           "pd": arms["pd"]["summary"], "colocated": arms["colocated"]["summary"],
           "cpu": info.model, "cpu_flags": sorted(info.flags)}
    from ..kvcache.pool.layout import KNOWN_SHAPES
    if args.transport_reps > 0 and not args.quick and args.model in KNOWN_SHAPES and t:
        from .pd_transport import measure as transport
        dtype = _kv_dtype(args.model, t["full_kv_bytes"], sum(len(r["prompt"]) for r in reqs))
        _log(f"transport: {w.long_tokens}-token KV, direct stream vs Redis ({dtype})")
        out["transport"] = transport(args.model, [w.long_tokens], dtype,
                                     reps=args.transport_reps)["rows"][0]
    if args.plot:
        from .pd_plot import plot
        plot(args.plot, {k: v["records"] for k, v in arms.items()}, out)
        out["plot"] = args.plot
    return out


def run(args) -> int:
    # Refuse before minutes of measuring, not after them.
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("--plot needs matplotlib (pip install -e '.[bench]')")
    out = measure(args)
    print(json.dumps(out), flush=True)
    return 0
