"""soak: many mixed requests against one real server; every one must end, nothing may leak.

One server (`server.py`, the embedded default model unless `--server-args` says otherwise, on
a free 127.0.0.1 port) gets `--num-requests` requests to /v1/completions, `--min-concurrency`
to `--max-concurrency` of them in flight (the level is redrawn every 25 requests). Prompts are
token ids or text, 1 to `--max-prompt-tokens` long, each a cut of one of `--prefixes` shared
prefixes (half the cuts snapped to a page boundary, +-1) plus a random suffix, so requests
share cached prefixes around page boundaries; `max_tokens` is 1 to `--max-tokens`, and a
`--long-fraction` of requests are long (a prompt of 90-100% of the maximum and up to
`--long-max-tokens` outputs) so that small pools must preempt or refuse them. Half the
requests stream; `--disconnect-fraction` of those close the connection after a random number
of chunks (a quarter of them before the first token, while the server has not answered yet);
`--timeout-fraction` of the others give up after a 0.2-1 s client timeout.

Each request ends as one of: `completed` (200 and a finish_reason), `error` (a clean error:
a 4xx/5xx JSON body with error.message, or an SSE event carrying one), `disconnected` or
`timed_out` (we hung up, as drawn), `stuck` (no end within `--request-timeout` s that we did
not ask for) or `failed` (anything else: a malformed answer, a dropped connection, a stream
that ends without a finish). /metrics is polled every 0.5 s: `max_step_stall_s` is the
longest time `mimo_engine_steps` stood still while requests were running or queued.

After the last request the server must come back to idle (within 30 s) with no KV page in
use in any pool and, within 10 s more, as many open file descriptors and threads as it had
after the warm-up: one request, then bursts of `--max-concurrency` at once until the counts
stand still (the server starts its pool for blocking work whole, but a client library's
pool may grow lazily; the counts after the single request are reported too). `ok` is all of
that plus no stuck or failed request and a step stall under `--max-stall`. A run that passes
`--timeout` s, or whose engine stops stepping for longer than `--request-timeout` + 10 s,
stops sending and reports failure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import signal
import sys
import time

from .server_process import ServerProcess
from .soak_client import OUTCOMES, drive
from .soak_metrics import (
    StallTracker,
    _num,
    count_fds,
    count_threads,
    metric_by,
    metric_sum,
    parse_metrics,
)
from .soak_workload import WORDS, Workload, build_requests, draw_cut

__all__ = ["StallTracker", "Workload", "build_requests", "draw_cut", "metric_by", "metric_sum",
           "parse_metrics"]

NAME = "soak"
def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="mixed requests, disconnects and timeouts against one "
                              "server: nothing stuck, no stall, no leaked KV, fds or threads",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--server-args", default="",
                   help="flags for server.py, one string (e.g. \"--admission optimistic "
                        "--kv-cache-memory 64MiB --swa-share 0.95\")")
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--threads", type=int, default=2, help="server CPU threads")
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--min-concurrency", type=int, default=8)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--prefixes", type=int, default=4, help="shared prompt prefixes")
    p.add_argument("--max-prompt-tokens", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=48, help="largest max_tokens of a short request")
    p.add_argument("--long-fraction", type=float, default=0.05)
    p.add_argument("--long-max-tokens", type=int, default=256)
    p.add_argument("--stream-fraction", type=float, default=0.5)
    p.add_argument("--text-fraction", type=float, default=0.25,
                   help="requests with text prompts (the rest send token ids)")
    p.add_argument("--disconnect-fraction", type=float, default=0.3,
                   help="streaming requests that hang up mid-stream")
    p.add_argument("--timeout-fraction", type=float, default=0.1,
                   help="non-streaming requests cancelled by a 0.2-1 s client timeout")
    p.add_argument("--request-timeout", type=float, default=120.0,
                   help="a request unanswered this long (s) that we did not cancel is stuck")
    p.add_argument("--max-stall", type=float, default=10.0,
                   help="longest allowed step stall (s) while requests are running or queued")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="total time limit (s) for start-up and requests; then it stops, failed")
    p.add_argument("--seed", type=int, default=0)
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def _get_metrics(url: str) -> dict | None:
    import httpx
    try:
        with httpx.Client(timeout=5.0) as c:
            return parse_metrics(c.get(url + "/metrics").text)
    except httpx.HTTPError:
        return None


def _warm_up(url: str, burst: int) -> None:
    """One request, then `burst` at once (text and token ids, streamed and not) with a shared
    prefix: any lazily grown, bounded pool reaches the size the run's concurrency gives it
    before fds and threads are counted."""
    import httpx
    with httpx.Client(timeout=300.0) as c:
        model = c.get(url + "/v1/models").json()["data"][0]["id"]
        r = c.post(url + "/v1/completions", json={"model": model, "prompt": "The capital of France is",
                                                  "max_tokens": 4, "temperature": 0})
        r.raise_for_status()
    if burst <= 0:
        return

    async def go():
        async with httpx.AsyncClient(timeout=300.0, limits=httpx.Limits(max_connections=burst)) as c:
            async def one(i):
                prompt = (" ".join(WORDS[:64]) + f" {WORDS[i % len(WORDS)]}" if i % 2 == 0
                          else list(range(100, 164)) + [200 + i])
                body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                        "stream": i % 4 == 1}
                (await c.post(url + "/v1/completions", json=body)).raise_for_status()
            await asyncio.gather(*(one(i) for i in range(burst)))
    asyncio.run(go())


def _settle(pid: int, tries: int = 8) -> tuple[int | None, int | None]:
    """fd and thread counts once two readings 0.25 s apart agree (the warm-up connection
    closing may lag a moment)."""
    prev = (count_fds(pid), count_threads(pid))
    for _ in range(tries):
        time.sleep(0.25)
        cur = (count_fds(pid), count_threads(pid))
        if cur == prev:
            return cur
        prev = cur
    return prev


def _warmed_counts(srv: ServerProcess, burst: int, out: dict) -> tuple[int | None, int | None]:
    """fds and threads once warm: after one request, then bursts until the counts stand still."""
    _warm_up(srv.url, 0)
    first = _settle(srv.pid)
    fds0, thr0 = first
    for _ in range(3):
        _warm_up(srv.url, burst)
        cur = _settle(srv.pid)
        if cur == (fds0, thr0):
            break
        fds0, thr0 = cur
    out.update(fds_after_one_request=first[0], threads_after_one_request=first[1])
    _log(f"warmed up: {fds0} fds, {thr0} threads (after one request: {first[0]}, {first[1]})")
    return fds0, thr0


def _wait_idle(srv: ServerProcess, poller) -> tuple[bool, dict]:
    """Nothing running or queued, up to 30 s; the last metrics seen."""
    m, t_idle = None, time.time()
    while time.time() < t_idle + 30 and srv.alive():
        m = _get_metrics(srv.url)
        if m is not None and not ((metric_sum(m, "mimo_running_requests") or 0)
                                  + (metric_sum(m, "mimo_queue_length") or 0)):
            return True, m
        time.sleep(0.5)
    return False, m or poller.last


def _counts_back(srv: ServerProcess, fds0, thr0) -> tuple[int | None, int | None]:
    """fds and threads, given up to 10 s to fall back to the warmed-up counts."""
    fds1, thr1 = count_fds(srv.pid), count_threads(srv.pid)
    t_back = time.time()
    while time.time() < t_back + 10 and srv.alive():
        fds1, thr1 = count_fds(srv.pid), count_threads(srv.pid)
        if fds1 is not None and thr1 is not None and fds1 <= fds0 and thr1 <= thr0:
            break
        time.sleep(0.25)
    return fds1, thr1


def _report(recs: list[dict], counts: dict, m: dict, kv: dict, poller, srv: ServerProcess,
            res: dict) -> dict:
    failures = [f"#{r['index']} {r['outcome']}: {r['detail']}" for r in recs
                if r["outcome"] in ("stuck", "failed")]
    errors: dict[str, int] = {}
    for r in recs:
        if r["outcome"] == "error":           # grouped by message, numbers elided
            key = re.sub(r"\d+", "N", r["detail"])[:110]
            errors[key] = errors.get(key, 0) + 1
    by_status = metric_by(m, "mimo_requests_total", "status")
    return {
        "outcomes": counts, "stuck": counts["stuck"],
        "max_step_stall_s": round(poller.stall.max_stall, 2),
        "metrics_polls": poller.polls, "metrics_poll_failures": poller.failures,
        "max_metrics_gap_s": round(poller.max_gap, 2),
        "running_at_end": _num(metric_sum(m, "mimo_running_requests")),
        "queued_at_end": _num(metric_sum(m, "mimo_queue_length")),
        "kv_in_use_idle": {k: _num(v) for k, v in kv.items()},
        "kv_capacity_pages": {k: _num(v) for k, v in (metric_by(
            m, "mimo_kv_pool_pages", "pool", state="capacity") or {}).items()},
        "preemptions": _num(metric_sum(m, "mimo_preemptions_total")),
        "failed_steps": _num(metric_sum(m, "mimo_failed_steps_total")),
        "aborted": _num(metric_sum(m, "mimo_requests_aborted_total")),
        "requests_by_status": None if by_status is None else {k: _num(v) for k, v in by_status.items()},
        "errors": errors, "failures": failures[:10],
        "long_completed": sum(r["long"] and r["outcome"] == "completed" for r in recs),
        "long_total": sum(r["long"] for r in recs),
        "server_alive": srv.alive(), "stopped": res["abort"],
        "requests_s": round(res["requests_s"], 2)}


def _fail_reasons(out: dict, counts: dict, kv: dict, srv: ServerProcess, stall: float,
                  max_stall: float) -> list[str]:
    reasons = []
    if out["stopped"]:
        reasons.append(f"stopped early: {out['stopped']}")
    if counts["stuck"]:
        reasons.append(f"{counts['stuck']} stuck requests")
    if counts["failed"]:
        reasons.append(f"{counts['failed']} requests failed uncleanly")
    if counts["not_sent"] or counts["unfinished"]:
        reasons.append(f"{counts['not_sent']} not sent, {counts['unfinished']} unfinished")
    if not srv.alive():
        reasons.append(f"server exited ({srv.proc.returncode})")
    if not out["idle_reached"]:
        reasons.append("server not idle 30 s after the last request")
    if not kv or any(v != 0 for v in kv.values()):
        reasons.append(f"KV pages in use at idle: {kv or 'no mimo_kv_pool_pages'}")
    fds0, fds1, thr0, thr1 = out["fds_start"], out["fds_end"], out["threads_start"], out["threads_end"]
    if fds0 is None or fds1 is None or fds1 > fds0:
        reasons.append(f"open fds {fds0} -> {fds1}")
    if thr0 is None or thr1 is None or thr1 > thr0:
        reasons.append(f"threads {thr0} -> {thr1}")
    if stall >= max_stall:
        reasons.append(f"step stall {stall:.1f} s >= {max_stall} s")
    return reasons


def measure(args) -> dict:
    t_start = time.time()
    deadline = t_start + args.timeout
    w = Workload(num_requests=args.num_requests, prefixes=args.prefixes,
                 max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens,
                 long_fraction=args.long_fraction, long_max_tokens=args.long_max_tokens,
                 stream_fraction=args.stream_fraction, text_fraction=args.text_fraction,
                 disconnect_fraction=args.disconnect_fraction,
                 timeout_fraction=args.timeout_fraction, seed=args.seed)
    reqs = build_requests(w)
    _log(f"{len(reqs)} requests: {sum(r['stream'] for r in reqs)} streamed, "
         f"{sum(r['action'] == 'disconnect' for r in reqs)} to disconnect, "
         f"{sum(r['action'] == 'timeout' for r in reqs)} to time out, "
         f"{sum(r['long'] for r in reqs)} long, {sum(r['text'] for r in reqs)} text; "
         f"server args: {args.server_args or '(defaults)'}")
    out: dict = {"bench": NAME, "server_args": args.server_args, "num_requests": len(reqs)}
    srv = ServerProcess(["--model", args.model, "--threads", str(args.threads),
                         "--log-level", "warning", *shlex.split(args.server_args)],
                        start_timeout=max(1.0, min(deadline - time.time(), 600)))
    try:
        _log(f"server pid {srv.pid} on {srv.url} answered /health after {time.time() - t_start:.1f}s")
        fds0, thr0 = _warmed_counts(srv, args.max_concurrency, out)
        res = asyncio.run(drive(srv.url, reqs, args, deadline))
        recs, poller = res["recs"], res["poller"]
        counts = {k: sum(r["outcome"] == k for r in recs) for k in OUTCOMES}
        counts["not_sent"] = len(reqs) - res["sent"]
        counts["unfinished"] = res["sent"] - len(recs)
        idle, m = _wait_idle(srv, poller)
        kv = metric_by(m, "mimo_kv_pool_pages", "pool", state="in_use") or {}
        fds1, thr1 = _counts_back(srv, fds0, thr0)
        out.update(_report(recs, counts, m, kv, poller, srv, res))
        out.update(idle_reached=idle, fds_start=fds0, fds_end=fds1, threads_start=thr0,
                   threads_end=thr1)
        reasons = _fail_reasons(out, counts, kv, srv, poller.stall.max_stall, args.max_stall)
        out["fail_reasons"] = reasons
        out["ok"] = not reasons
        if reasons:
            _log("FAILED: " + "; ".join(reasons))
            for f in out["failures"]:
                _log(f"  {f}")
            tail = srv.log_tail(2000).strip()
            if tail:
                _log("server log tail:\n" + tail)
    finally:
        srv.stop()
    out["wall_s"] = round(time.time() - t_start, 2)
    return out


def _sigterm(signum, frame):
    raise SystemExit(128 + signum)


def run(args) -> int:
    if not 1 <= args.min_concurrency <= args.max_concurrency:
        print("error: need 1 <= --min-concurrency <= --max-concurrency", file=sys.stderr)
        return 2
    if args.num_requests < 0 or args.max_prompt_tokens < 1 or args.max_tokens < 1 or args.prefixes < 1:
        print("error: --num-requests >= 0, --max-prompt-tokens, --max-tokens, --prefixes >= 1",
              file=sys.stderr)
        return 2
    old = signal.signal(signal.SIGTERM, _sigterm)   # so the finally that stops the server runs
    try:
        try:
            out = measure(args)
        except Exception as e:  # noqa: BLE001 - the server did not start or warm up
            import traceback
            traceback.print_exc()
            out = {"bench": NAME, "server_args": args.server_args,
                   "num_requests": args.num_requests, "ok": False, "fail_reasons": [str(e)[:500]]}
    finally:
        signal.signal(signal.SIGTERM, old)
    print(json.dumps(out), flush=True)
    return 0 if out.get("ok") else 1
