"""soak's client: one request to its end (completed, clean error, hung up as drawn, stuck or
failed) and the driver that keeps min..max of them in flight while /metrics is polled."""
from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time

from .soak_metrics import Poller

OUTCOMES = ("completed", "error", "disconnected", "timed_out", "stuck", "failed")
FINISH_REASONS = ("stop", "length")


def _log(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


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
