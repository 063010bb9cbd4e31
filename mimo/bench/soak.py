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
stand still (asyncio's default executor, which tokenizes text, grows lazily up to a bound and
keeps its threads; the counts after the single request are reported too). `ok` is all of
that plus no stuck or failed request and a step stall under `--max-stall`. A run that passes
`--timeout` s, or whose engine stops stepping for longer than `--request-timeout` + 10 s,
stops sending and reports failure.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass

from .server_process import ServerProcess

NAME = "soak"
OUTCOMES = ("completed", "error", "disconnected", "timed_out", "stuck", "failed")
FINISH_REASONS = ("stop", "length")
# Short common words: mostly one token each with their leading space.
WORDS = ("the of and to in is it that was for on are as with his they at be this have from "
         "or one had by word but not what all were we when your can said there use an each "
         "which she do how their if will up other about out many then them these so some her "
         "would make like him into time has look two more write go see number no way could "
         "people my than first water been call who oil its now find long down day did get "
         "come made may part over new sound take only little work know place year live me "
         "back give most very after thing our just name good sentence man think say great "
         "where help through much before line right too mean old any same tell boy follow "
         "came want show also around form three small set put end does another well large "
         "must big even such because turn here why ask went men read need land different "
         "home us move try kind hand picture again change off play spell air away animal "
         "house point page letter mother answer found study still learn should world").split()


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


# ---- workload (pure) --------------------------------------------------------------------
@dataclass
class Workload:
    num_requests: int = 1000
    prefixes: int = 4
    max_prompt_tokens: int = 1500
    max_tokens: int = 48
    long_fraction: float = 0.05
    long_max_tokens: int = 256
    stream_fraction: float = 0.5
    text_fraction: float = 0.25
    disconnect_fraction: float = 0.3
    timeout_fraction: float = 0.1
    page_size: int = 16
    seed: int = 0
    vocab: tuple = (100, 20000)


def make_prefixes(w: Workload, rng: random.Random) -> tuple[list[list[int]], list[list[str]]]:
    """`w.prefixes` token-id prefixes and as many word prefixes, each max_prompt_tokens long."""
    ids = [[rng.randrange(*w.vocab) for _ in range(w.max_prompt_tokens)] for _ in range(w.prefixes)]
    words = [[rng.choice(WORDS) for _ in range(w.max_prompt_tokens)] for _ in range(w.prefixes)]
    return ids, words


def draw_cut(rng: random.Random, n: int, page: int) -> int:
    """How much of an n-token prompt comes from its prefix: n minus a suffix of 0-48, half the
    time snapped to a page boundary +-1 (where the cache's pages and windows are cut)."""
    cut = n - rng.randint(0, min(n, 48))
    if rng.random() < 0.5:
        cut = round(cut / page) * page + rng.choice((-1, 0, 1))
    return max(0, min(n, cut))


def draw_request(w: Workload, rng: random.Random, ids_pre, word_pre, index: int = 0) -> dict:
    """One request: {'prompt': ids or text, 'n': prompt length (words for text), 'max_tokens',
    'stream', 'long', 'action': 'complete' | 'disconnect' | 'timeout', 'after_chunks',
    'cancel_after_s'}."""
    long = rng.random() < w.long_fraction
    if long:
        n = rng.randint(max(1, int(0.9 * w.max_prompt_tokens)), w.max_prompt_tokens)
        max_tokens = rng.randint(min(w.max_tokens + 1, w.long_max_tokens), w.long_max_tokens)
    else:
        n = rng.randint(1, w.max_prompt_tokens)
        max_tokens = rng.randint(1, w.max_tokens)
    cut = draw_cut(rng, n, w.page_size)
    k = rng.randrange(w.prefixes)
    text = rng.random() < w.text_fraction
    if text:
        prompt = " ".join(word_pre[k][:cut] + [rng.choice(WORDS) for _ in range(n - cut)])
    else:
        prompt = ids_pre[k][:cut] + [rng.randrange(*w.vocab) for _ in range(n - cut)]
    req = {"index": index, "prompt": prompt, "n": n, "prefix": k, "cut": cut, "text": text,
           "max_tokens": max_tokens, "long": long, "stream": rng.random() < w.stream_fraction,
           "action": "complete", "after_chunks": None, "cancel_after_s": None}
    if req["stream"] and rng.random() < w.disconnect_fraction:
        req["action"] = "disconnect"
        if rng.random() < 0.25:         # before the first token: the server has not answered
            req["after_chunks"], req["cancel_after_s"] = 0, round(rng.uniform(0.0, 0.5), 3)
        else:
            req["after_chunks"] = rng.randint(1, max(1, max_tokens - 1))
    elif not req["stream"] and rng.random() < w.timeout_fraction:
        req["action"], req["cancel_after_s"] = "timeout", round(rng.uniform(0.2, 1.0), 3)
    return req


def build_requests(w: Workload) -> list[dict]:
    rng = random.Random(w.seed)
    ids_pre, word_pre = make_prefixes(w, rng)
    return [draw_request(w, rng, ids_pre, word_pre, i) for i in range(w.num_requests)]


# ---- metrics (pure) ---------------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text format -> {sample name: [(labels, value), ...]}."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, tail = rest.rpartition("}")
            i = 0
            while i < len(body):
                eq = body.index("=", i)
                key = body[i:eq].strip().lstrip(",").strip()
                j, val = eq + 2, []         # skip ="
                while body[j] != '"':
                    if body[j] == "\\" and j + 1 < len(body):
                        j += 1
                        val.append({"n": "\n"}.get(body[j], body[j]))
                    else:
                        val.append(body[j])
                    j += 1
                labels[key] = "".join(val)
                i = j + 1
            value = tail.split()[0]
        else:
            parts = line.split()
            if len(parts) < 2:
                continue
            name, value = parts[0], parts[1]
        try:
            out.setdefault(name.strip(), []).append((labels, float(value)))
        except ValueError:
            continue
    return out


def metric_sum(m: dict, name: str, **match) -> float | None:
    """Sum of a metric's samples whose labels include `match`; None when it is absent."""
    if name not in m:
        return None
    return sum(v for labels, v in m[name] if all(labels.get(k) == x for k, x in match.items()))


def metric_by(m: dict, name: str, label: str, **match) -> dict[str, float] | None:
    if name not in m:
        return None
    out: dict[str, float] = {}
    for labels, v in m[name]:
        if all(labels.get(k) == x for k, x in match.items()):
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def _num(x: float | None):
    return None if x is None else (int(x) if float(x).is_integer() else round(x, 3))


class StallTracker:
    """Longest interval in which the step counter did not move while the engine had work.
    An interval starts at the last observation where the counter changed (or the engine
    went from idle to busy) and grows with every busy observation of the same count."""

    def __init__(self):
        self.steps = None
        self.since = None          # start of the current no-progress busy interval
        self.max_stall = 0.0

    def observe(self, now: float, steps: float, busy: bool) -> None:
        if self.steps is None or steps != self.steps or not busy:
            self.steps, self.since = steps, (now if busy else None)
            return
        if self.since is None:
            self.since = now
        self.max_stall = max(self.max_stall, now - self.since)

    def current(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since


# ---- the server -------------------------------------------------------------------------
def count_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def count_threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


# ---- driving it -------------------------------------------------------------------------
def _error_message(obj) -> str | None:
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        msg = obj["error"].get("message")
        if isinstance(msg, str) and msg:
            return msg
    return None


async def _whole(client, url: str, body: dict) -> tuple[str, str]:
    r = await client.post(url + "/v1/completions", json=body)
    try:
        obj = r.json()
    except ValueError:
        return "failed", f"HTTP {r.status_code}, not JSON: {r.text[:160]!r}"
    if r.status_code == 200:
        ch = (obj.get("choices") or [{}])[0]
        if ch.get("finish_reason") in FINISH_REASONS and isinstance(ch.get("text"), str):
            return "completed", ch["finish_reason"]
        return "failed", f"200 without a finish: {json.dumps(obj)[:160]}"
    msg = _error_message(obj)
    if r.status_code >= 400 and msg:
        return "error", f"HTTP {r.status_code}: {msg[:120]}"
    return "failed", f"HTTP {r.status_code}: {r.text[:160]!r}"


async def _stream(client, url: str, body: dict, after_chunks: int | None, got_headers) -> tuple[str, str]:
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        got_headers.set()
        if r.status_code != 200:
            raw = await r.aread()
            try:
                msg = _error_message(json.loads(raw))
            except ValueError:
                msg = None
            if r.status_code >= 400 and msg:
                return "error", f"HTTP {r.status_code}: {msg[:120]}"
            return "failed", f"HTTP {r.status_code}: {raw[:160]!r}"
        if after_chunks == 0:
            return "disconnected", "after 0 chunks (headers only)"
        chunks, finish = 0, None
        async for line in r.aiter_lines():
            if not line.strip():
                continue
            if not line.startswith("data: "):
                return "failed", f"not an SSE data line: {line[:120]!r}"
            if line == "data: [DONE]":
                if finish in FINISH_REASONS:
                    return "completed", finish
                return "failed", f"[DONE] without a finish_reason after {chunks} chunks"
            try:
                ev = json.loads(line[6:])
            except ValueError:
                return "failed", f"bad SSE JSON: {line[:120]!r}"
            msg = _error_message(ev)
            if msg:
                return "error", f"SSE error: {msg[:120]}"
            for ch in ev.get("choices") or []:
                finish = ch.get("finish_reason") or finish
            if ev.get("choices"):
                chunks += 1
                if after_chunks is not None and chunks >= after_chunks and finish is None:
                    return "disconnected", f"after {chunks} chunks"
        return "failed", f"stream ended without [DONE] after {chunks} chunks"


async def one_request(client, url: str, model: str, req: dict, bound: float) -> dict:
    body = {"model": model, "prompt": req["prompt"], "max_tokens": req["max_tokens"],
            "temperature": 0, "stream": req["stream"]}
    if req["stream"]:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    got_headers = asyncio.Event()
    if req["stream"]:
        work = _stream(client, url, body, req["after_chunks"], got_headers)
    else:
        work = _whole(client, url, body)
    task = asyncio.ensure_future(work)
    outcome, detail = None, ""
    try:
        if req["action"] == "timeout" or (req["action"] == "disconnect" and req["after_chunks"] == 0):
            done, _ = await asyncio.wait({task}, timeout=req["cancel_after_s"])
            if not done and not got_headers.is_set():
                outcome = "timed_out" if req["action"] == "timeout" else "disconnected"
                detail = f"cancelled after {req['cancel_after_s']} s"
        if outcome is None:
            left = bound - (time.perf_counter() - t0)
            done, _ = await asyncio.wait({task}, timeout=max(0.0, left))
            if not done:
                outcome, detail = "stuck", f"no end in {bound:.0f} s"
            else:
                try:
                    outcome, detail = task.result()
                except Exception as e:  # noqa: BLE001 - a dropped connection, a protocol error
                    outcome, detail = "failed", f"{type(e).__name__}: {e}"[:200]
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    return {"index": req["index"], "outcome": outcome, "detail": detail, "long": req["long"],
            "stream": req["stream"], "s": round(time.perf_counter() - t0, 3)}


class Poller:
    """Polls /metrics every 0.5 s: step stalls, the last sample, failed polls."""

    def __init__(self, url: str):
        self.url, self.stall = url, StallTracker()
        self.last: dict = {}
        self.failures = 0
        self.polls = 0
        self.max_gap = 0.0          # longest time between two successful polls
        self.busy = False

    async def run(self, stop: asyncio.Event) -> None:
        import httpx
        last_ok = time.perf_counter()
        async with httpx.AsyncClient(timeout=5.0) as client:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    r = await client.get(self.url + "/metrics")
                    m = parse_metrics(r.text)
                    now = time.perf_counter()
                    busy = ((metric_sum(m, "mimo_running_requests") or 0)
                            + (metric_sum(m, "mimo_queue_length") or 0)) > 0
                    steps = metric_sum(m, "mimo_engine_steps")
                    if steps is not None:
                        self.stall.observe(now, steps, busy)
                    self.busy = busy
                    self.last, self.polls = m, self.polls + 1
                    self.max_gap = max(self.max_gap, now - last_ok)
                    last_ok = now
                except Exception:  # noqa: BLE001 - a frozen or dead server: counted, not fatal
                    self.failures += 1      # and, if it had work, no step was seen: a stall
                    if self.stall.steps is not None:
                        self.stall.observe(time.perf_counter(), self.stall.steps, self.busy)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, 0.5 - (time.perf_counter() - t)))


async def drive(url: str, reqs: list[dict], args, deadline: float) -> dict:
    """Send every request, min..max concurrency in flight; returns records and the poller."""
    import httpx
    rng = random.Random(args.seed + 1)
    poller, stop = Poller(url), asyncio.Event()
    poll_task = asyncio.create_task(poller.run(stop))
    recs: list[dict] = []
    limits = httpx.Limits(max_connections=args.max_concurrency + 4,
                          max_keepalive_connections=args.max_concurrency + 4)
    timeout = httpx.Timeout(args.request_timeout + 10, pool=args.request_timeout + 10)
    abort = None
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        pending: set = set()
        sent, target, next_log = 0, rng.randint(args.min_concurrency, args.max_concurrency), 50
        try:
            while sent < len(reqs) or pending:
                while sent < len(reqs) and len(pending) < target and abort is None:
                    pending.add(asyncio.create_task(
                        one_request(client, url, model, reqs[sent], args.request_timeout)))
                    sent += 1
                    if sent % 25 == 0:
                        target = rng.randint(args.min_concurrency, args.max_concurrency)
                if not pending:
                    break
                done, pending = await asyncio.wait(pending, timeout=0.5,
                                                   return_when=asyncio.FIRST_COMPLETED)
                recs.extend(t.result() for t in done)
                now = time.perf_counter()
                if abort is None and time.time() > deadline:
                    abort = f"--timeout {args.timeout:.0f} s reached"
                if abort is None and poller.stall.current(now) > args.request_timeout + 10:
                    abort = f"engine steps stalled for {poller.stall.current(now):.0f} s"
                if abort is not None and sent < len(reqs):
                    _log(f"stopping: {abort}; {len(reqs) - sent} requests not sent")
                    reqs = reqs[:sent]
                if abort is not None and time.time() > deadline + args.request_timeout + 15:
                    break               # in-flight requests are bounded; this is a backstop
                if len(recs) >= next_log or (not pending and sent >= len(reqs)):
                    next_log = len(recs) + 50
                    counts = {k: sum(r["outcome"] == k for r in recs) for k in OUTCOMES}
                    _log(f"{len(recs)}/{len(reqs)} done, {len(pending)} in flight, "
                         f"{now - t0:.0f}s, " + " ".join(f"{k}={v}" for k, v in counts.items() if v)
                         + f", max step stall {poller.stall.max_stall:.1f}s")
        finally:
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(BaseException):
                    await t
            stop.set()
            with contextlib.suppress(BaseException):
                await poll_task
    return {"recs": recs, "poller": poller, "abort": abort, "sent": sent,
            "requests_s": time.perf_counter() - t0}


def _get_metrics(url: str) -> dict | None:
    import httpx
    try:
        with httpx.Client(timeout=5.0) as c:
            return parse_metrics(c.get(url + "/metrics").text)
    except httpx.HTTPError:
        return None


def _warm_up(url: str, burst: int) -> None:
    """One request, then `burst` at once (text and token ids, streamed and not) with a shared
    prefix: lazily grown, bounded pools (asyncio's default executor, which tokenizes text)
    reach the size the run's concurrency gives them before fds and threads are counted."""
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
        _warm_up(srv.url, 0)
        first = _settle(srv.pid)
        fds0, thr0 = first
        for _ in range(3):          # bursts until the counts stand still
            _warm_up(srv.url, args.max_concurrency)
            cur = _settle(srv.pid)
            if cur == (fds0, thr0):
                break
            fds0, thr0 = cur
        out.update(fds_after_one_request=first[0], threads_after_one_request=first[1])
        _log(f"warmed up: {fds0} fds, {thr0} threads (after one request: {first[0]}, {first[1]})")
        res = asyncio.run(drive(srv.url, reqs, args, deadline))
        recs, poller = res["recs"], res["poller"]
        counts = {k: sum(r["outcome"] == k for r in recs) for k in OUTCOMES}
        counts["not_sent"] = len(reqs) - res["sent"]
        counts["unfinished"] = res["sent"] - len(recs)
        # idle: nothing running or queued, up to 30 s
        idle, m, t_idle = False, None, time.time()
        while time.time() < t_idle + 30 and srv.alive():
            m = _get_metrics(srv.url)
            if m is not None and not ((metric_sum(m, "mimo_running_requests") or 0)
                                      + (metric_sum(m, "mimo_queue_length") or 0)):
                idle = True
                break
            time.sleep(0.5)
        m = m or poller.last
        kv = metric_by(m, "mimo_kv_pool_pages", "pool", state="in_use") or {}
        fds1, thr1 = count_fds(srv.pid), count_threads(srv.pid)
        t_back = time.time()
        while time.time() < t_back + 10 and srv.alive():
            fds1, thr1 = count_fds(srv.pid), count_threads(srv.pid)
            if fds1 is not None and thr1 is not None and fds1 <= fds0 and thr1 <= thr0:
                break
            time.sleep(0.25)
        failures = [f"#{r['index']} {r['outcome']}: {r['detail']}" for r in recs
                    if r["outcome"] in ("stuck", "failed")]
        errors = {}
        for r in recs:
            if r["outcome"] == "error":           # grouped by message, numbers elided
                key = re.sub(r"\d+", "N", r["detail"])[:110]
                errors[key] = errors.get(key, 0) + 1
        by_status = metric_by(m, "mimo_requests_total", "status")
        out.update({
            "outcomes": counts, "stuck": counts["stuck"],
            "max_step_stall_s": round(poller.stall.max_stall, 2),
            "metrics_polls": poller.polls, "metrics_poll_failures": poller.failures,
            "max_metrics_gap_s": round(poller.max_gap, 2),
            "idle_reached": idle,
            "running_at_end": _num(metric_sum(m, "mimo_running_requests")),
            "queued_at_end": _num(metric_sum(m, "mimo_queue_length")),
            "kv_in_use_idle": {k: _num(v) for k, v in kv.items()},
            "kv_capacity_pages": {k: _num(v) for k, v in (metric_by(
                m, "mimo_kv_pool_pages", "pool", state="capacity") or {}).items()},
            "fds_start": fds0, "fds_end": fds1, "threads_start": thr0, "threads_end": thr1,
            "preemptions": _num(metric_sum(m, "mimo_preemptions_total")),
            "failed_steps": _num(metric_sum(m, "mimo_failed_steps_total")),
            "aborted": _num(metric_sum(m, "mimo_requests_aborted_total")),
            "requests_by_status": None if by_status is None else {k: _num(v) for k, v in by_status.items()},
            "errors": errors, "failures": failures[:10],
            "long_completed": sum(r["long"] and r["outcome"] == "completed" for r in recs),
            "long_total": sum(r["long"] for r in recs),
            "server_alive": srv.alive(), "stopped": res["abort"],
            "requests_s": round(res["requests_s"], 2)})
        reasons = []
        if res["abort"]:
            reasons.append(f"stopped early: {res['abort']}")
        if counts["stuck"]:
            reasons.append(f"{counts['stuck']} stuck requests")
        if counts["failed"]:
            reasons.append(f"{counts['failed']} requests failed uncleanly")
        if counts["not_sent"] or counts["unfinished"]:
            reasons.append(f"{counts['not_sent']} not sent, {counts['unfinished']} unfinished")
        if not srv.alive():
            reasons.append(f"server exited ({srv.proc.returncode})")
        if not idle:
            reasons.append("server not idle 30 s after the last request")
        if not kv or any(v != 0 for v in kv.values()):
            reasons.append(f"KV pages in use at idle: {kv or 'no mimo_kv_pool_pages'}")
        if fds0 is None or fds1 is None or fds1 > fds0:
            reasons.append(f"open fds {fds0} -> {fds1}")
        if thr0 is None or thr1 is None or thr1 > thr0:
            reasons.append(f"threads {thr0} -> {thr1}")
        if poller.stall.max_stall >= args.max_stall:
            reasons.append(f"step stall {poller.stall.max_stall:.1f} s >= {args.max_stall} s")
        out["fail_reasons"] = reasons
        out["ok"] = not reasons
        if reasons:
            _log("FAILED: " + "; ".join(reasons))
            for f in failures[:10]:
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
