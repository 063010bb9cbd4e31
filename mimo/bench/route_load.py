"""bench route's workloads and client: multi-turn chat sessions and a Mooncake trace slice,
streamed through a router (or one worker), one record per request.

A record: the session and turn (trace: the request it continues, if any), the worker that
answered (the router's x-mimo-worker header), prompt and cached tokens (the worker's usage),
TTFT (to the first streamed chunk with a choice) and end-to-end seconds.
"""
from __future__ import annotations

import asyncio
import json
import random
import sys
import time

WORDS = ("river stone cloud paper lamp orange window garden silver engine market violin "
         "harbor candle forest planet bridge coffee rocket winter summer mirror ladder "
         "pencil thunder meadow castle lemon tiger falcon copper velvet").split()


def _text(rnd: random.Random, n: int) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(n))


def sessions(n: int, turns: int, shared: bool, system_words: int, user_words: int,
             seed: int = 0) -> list[dict]:
    """n sessions: a system prompt (one for all when `shared`, else one each) and `turns`
    user messages each."""
    rnd = random.Random(seed)
    common = "You are a helpful assistant. " + _text(rnd, system_words)
    out = []
    for i in range(n):
        system = common if shared else f"You are assistant {i}. " + _text(rnd, system_words)
        out.append({"system": system,
                    "users": [f"[{i}.{t}] " + _text(rnd, user_words) for t in range(turns)]})
    return out


def trace_parents(rows) -> list[int | None]:
    """For each trace request, the latest earlier one whose blocks (all, or all but its
    partial last one) begin its own beyond the first block (the turn it continues), or
    None. Prefixes are named by chained hashes, so this is linear in the trace's blocks."""
    last: dict[int, int] = {}
    out: list[int | None] = []
    for j, r in enumerate(rows):
        chain, parent = [], None
        key = 0
        for h in r["hash_ids"]:
            key = hash((key, h))
            chain.append(key)
        for k in range(len(chain) - 1, 0, -1):    # not on the shared first block alone
            if chain[k] in last:
                parent = last[chain[k]]
                break
        out.append(parent)
        # A request's last block is usually partial: the next turn extends its full blocks.
        for k in chain[-2:]:
            last[k] = j
    return out


def conversations(rows, n: int) -> tuple[list[dict], list[int | None]]:
    """About n requests of the trace's conversations (chains of requests that continue one
    another), every k-th conversation in order of their first requests so that their
    starts spread over the whole trace as its users arrived: (their rows in time order, each
    one's parent index among them). A time slice of the trace would hold few continuations
    (its turns are minutes apart); the first conversations alone would start within the
    trace's first minutes, a burst once the hour they span is scaled to --trace-duration."""
    parents = trace_parents(rows)
    root: list[int] = []
    for j, p in enumerate(parents):
        root.append(root[p] if p is not None else j)
    members: dict[int, list[int]] = {}
    for j, r in enumerate(root):
        members.setdefault(r, []).append(j)
    chains = [members[r] for r in sorted(members) if len(members[r]) >= 2]
    stride = max(1, sum(map(len, chains)) // max(n, 1))
    chosen: list[int] = []
    for c in chains[::stride]:
        chosen.extend(c)
        if len(chosen) >= n:
            break
    chosen.sort()
    pos = {j: i for i, j in enumerate(chosen)}
    return ([rows[j] for j in chosen],
            [pos.get(parents[j]) if parents[j] is not None else None for j in chosen])


async def _stream(client, url: str, path: str, body: dict, rec: dict) -> str:
    body = {**body, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    text: list[str] = []
    rec.update(ttft=None, cached=0, prompt=0)
    async with client.stream("POST", url + path, json=body) as resp:
        rec["worker"] = resp.headers.get("x-mimo-worker")
        rec["predicted"] = int(resp.headers.get("x-mimo-predicted-cached-tokens", 0))
        if resp.status_code != 200:
            rec["error"] = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            return ""
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                rec["error"] = str(ev["error"])[:200]
            for ch in ev.get("choices") or ():
                if rec["ttft"] is None:
                    rec["ttft"] = time.perf_counter() - sent
                text.append((ch.get("delta") or {}).get("content") or ch.get("text") or "")
            if ev.get("usage"):
                rec["cached"] = ev["usage"]["prompt_tokens_details"]["cached_tokens"]
                rec["prompt"] = ev["usage"]["prompt_tokens"]
    rec["e2e"] = time.perf_counter() - sent
    return "".join(text)


async def run_sessions(url: str, model: str, convs: list[dict], max_tokens: int,
                       gap: float = 0.0) -> list[dict]:
    """Closed loop: each session sends its next turn when the last one's answer is in;
    session i starts `gap` * i seconds after the first."""
    import httpx
    recs: list[dict] = []

    async def one(client, i, conv):
        await asyncio.sleep(gap * i)
        msgs = [{"role": "system", "content": conv["system"]}]
        for t, user in enumerate(conv["users"]):
            msgs.append({"role": "user", "content": user})
            rec = {"session": i, "turn": t}
            out = await _stream(client, url, "/v1/chat/completions",
                                {"model": model, "messages": msgs, "max_tokens": max_tokens}, rec)
            recs.append(rec)
            msgs.append({"role": "assistant", "content": out})
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_connections=len(convs) + 4)) as client:
        await asyncio.gather(*(one(client, i, c) for i, c in enumerate(convs)))
    return recs


async def run_trace(url: str, model: str, reqs: list[dict], parents) -> list[dict]:
    """Open loop: each request at its (scaled) arrival time; a continuation's 'session' is
    its chain's first request, its 'prev' the request it continues."""
    import httpx
    recs = [{"index": j, "prev": parents[j]} for j in range(len(reqs))]

    async def one(client, j, r, t0):
        await asyncio.sleep(max(0.0, t0 + r["at"] - time.perf_counter()))
        await _stream(client, url, "/v1/completions",
                      {"model": model, "prompt": r["prompt"], "max_tokens": r["max_tokens"]},
                      recs[j])
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_connections=len(reqs) + 4)) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, j, r, t0) for j, r in enumerate(reqs)))
    return recs


def log(msg: str) -> None:
    print(f"[route] {msg}", file=sys.stderr, flush=True)
