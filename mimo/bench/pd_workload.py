"""bench pd's workload, its streaming client and the arithmetic of its figures.

The workload (seeded): `short` requests (prompts of uniform [short_lo, short_hi] random token
ids, `short_max_tokens` greedy tokens: the requests that decode) and `long` ones (prompts of
`long_tokens` ids, `long_max_tokens` tokens: the long prefills), each kind arriving as a
Poisson process from t = 0 (exponential gaps of mean `short_gap` / `long_gap` seconds), so
that long prefills land while short requests decode. Prompts are independent random ids:
no prefix is shared, nothing is a cache hit.

A record per request: its kind, prompt length, when it was sent, TTFT (to the first streamed
chunk with text), the arrival time of every chunk with text, the text, completion tokens,
cached tokens, the workers that served it (x-mimo-worker, x-mimo-prefill).

Inter-token latency is the gap between consecutive text chunks of one stream (the server
streams a chunk per token; a chunk holding more than one token counts as one gap).
Percentiles are nearest-rank: the ceil(q/100 * n)-th smallest.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    seed: int = 0
    short: int = 6
    short_lo: int = 64
    short_hi: int = 128
    short_max_tokens: int = 32
    short_gap: float = 0.8
    long: int = 3
    long_tokens: int = 1536
    long_max_tokens: int = 8
    long_gap: float = 3.0
    vocab_lo: int = 100
    vocab_hi: int = 20000


def requests(w: Workload) -> list[dict]:
    """[{'kind', 'at', 'prompt', 'max_tokens'}] sorted by arrival."""
    rnd = random.Random(w.seed)
    out = []
    for kind, n, gap in (("short", w.short, w.short_gap), ("long", w.long, w.long_gap)):
        at = 0.0
        for _ in range(n):
            at += rnd.expovariate(1.0 / gap)
            size = (w.long_tokens if kind == "long" else rnd.randint(w.short_lo, w.short_hi))
            out.append({"kind": kind, "at": round(at, 3),
                        "prompt": [rnd.randrange(w.vocab_lo, w.vocab_hi) for _ in range(size)],
                        "max_tokens": w.long_max_tokens if kind == "long" else w.short_max_tokens})
    return sorted(out, key=lambda r: r["at"])


async def _one(client, url: str, model: str, req: dict, t0: float, rec: dict) -> None:
    await asyncio.sleep(max(0.0, t0 + req["at"] - time.perf_counter()))
    sent = time.perf_counter()
    body = {"model": model, "prompt": req["prompt"], "max_tokens": req["max_tokens"],
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if "salt" in req:
        body["cache_salt"] = req["salt"]
    rec.update(kind=req["kind"], prompt_tokens=len(req["prompt"]), sent=sent - t0, ttft=None,
               times=[], text="", out=0, cached=0)
    parts = []
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        rec["worker"] = resp.headers.get("x-mimo-worker")
        rec["prefill"] = resp.headers.get("x-mimo-prefill")
        if resp.status_code != 200:
            rec["error"] = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                rec["error"] = str(ev["error"])[:200]
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                now = time.perf_counter()
                if rec["ttft"] is None:
                    rec["ttft"] = now - sent
                rec["times"].append(now - t0)
                parts.append(ch[0]["text"])
            if ev.get("usage"):
                rec["out"] = ev["usage"]["completion_tokens"]
                rec["cached"] = ev["usage"]["prompt_tokens_details"]["cached_tokens"]
    rec["text"] = "".join(parts)


async def replay(url: str, reqs: list[dict], label: str, log) -> list[dict]:
    """Send `reqs` at their arrival times to `url`, streamed; one record each."""
    import httpx
    recs: list[dict] = [{} for _ in reqs]
    limits = httpx.Limits(max_connections=len(reqs) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_one(client, url, model, r, t0, rec))
                 for r, rec in zip(reqs, recs)]
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=10)
            log(f"{label}: {len(tasks) - len(pending)}/{len(tasks)} done, "
                f"{time.perf_counter() - t0:.0f} s")
        for t in tasks:
            t.result()
    return recs


def pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no data)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def gaps(rec: dict) -> list[float]:
    t = rec.get("times") or []
    return [b - a for a, b in zip(t, t[1:])]


def _p(xs: list[float]) -> dict:
    r = {q: pct(xs, q) for q in (50, 90)}
    return {f"p{q}": (None if v is None else round(v, 4)) for q, v in r.items()}


def summarize(recs: list[dict]) -> dict:
    """TTFT and inter-token latency p50/p90, over all requests and per kind."""
    ok = [r for r in recs if r.get("ttft") is not None and "error" not in r]
    out = {"requests": len(recs), "errors": len(recs) - len(ok),
           "ttft": _p([r["ttft"] for r in ok]), "itl": _p([g for r in ok for g in gaps(r)])}
    for kind in ("short", "long"):
        rs = [r for r in ok if r["kind"] == kind]
        out[kind] = {"ttft": _p([r["ttft"] for r in rs]),
                     "itl": _p([g for r in rs for g in gaps(r)])}
    return out


def same_tokens(a: list[dict], b: list[dict]) -> tuple[bool, list[int]]:
    """(every request's answer equal in text and token count in both runs, the indices of
    those that differ or failed; a request missing from one run counts as differing)."""
    bad = [i for i, (x, y) in enumerate(zip(a, b)) if "error" in x or "error" in y
           or (x["text"], x["out"]) != (y["text"], y["out"])]
    bad += list(range(min(len(a), len(b)), max(len(a), len(b))))
    return not bad, bad


async def sequential(url: str, reqs: list[dict], label: str, log) -> list[dict]:
    """Each request alone, one after the other (no batching with any other), in a cache
    namespace of its own (no hit on what earlier runs left in the worker's prefix cache):
    the single-worker reference answers."""
    out = []
    for i, r in enumerate(reqs):
        out += await replay(url, [{**r, "at": 0.0, "salt": f"reference-{i}"}], f"{label} {i + 1}/{len(reqs)}",
                            lambda m: None)
    log(f"{label}: {len(reqs)} requests done")
    return out


def transfer_figures(pre0: dict, pre1: dict, dec0: dict, dec1: dict) -> dict:
    """The KV transfers of one run, from the workers' /v1/internal/kv_transfers before (0)
    and after (1): bytes on the wire against a full-KV layout of the same prompts, and the
    time they took against the prefill time."""
    def d(a: dict, b: dict, k: str) -> float:
        return b[k] - a[k]
    s0, s1, r0, r1 = pre0["sent"], pre1["sent"], dec0["received"], dec1["received"]
    wire, full = d(r0, r1, "wire_bytes"), d(r0, r1, "full_kv_bytes")
    prefill, send = d(s0, s1, "prefill_seconds"), d(s0, s1, "send_seconds")
    tail = d(s0, s1, "send_tail_seconds")
    recv = d(r0, r1, "seconds")
    return {"transfers": int(d(r0, r1, "transfers")), "failed": int(d(r0, r1, "failed")),
            "recomputed": int(d(r0, r1, "recomputed")),
            # payloads that arrived but could not be placed: run whole on the decode worker
            "import_recomputed": int(d(r0, r1, "import_recomputed")), "wire_bytes": int(wire),
            "kv_bytes": int(d(r0, r1, "kv_bytes")), "full_kv_bytes": int(full),
            "kv_bytes_ratio": round(wire / full, 4) if full else None,
            "prefill_s": round(prefill, 3), "send_s": round(send, 4),
            # prompt computed -> last byte handed to the socket: the sending that did not
            # overlap the prefill (frames go out while later layers and chunks compute)
            "send_tail_s": round(tail, 4),
            "receive_s": round(recv, 3),
            # the prefill worker handing the stream to the socket, per second of prefill
            "transfer_fraction": round(send / prefill, 5) if prefill else None,
            # decode side: request sent -> last byte, beyond the prefill worker's compute
            "transfer_overhead_fraction": (round((recv - prefill) / prefill, 4)
                                           if prefill else None)}
