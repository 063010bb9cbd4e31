"""The model-free half of `bench agent`: agent sessions through the real radix tree at a real
model's KV shapes (`mimo.bench.sim_cache.CacheSim`), with sessions paused in a tool call
held (`--tool-pause-hold`) or not, per KV budget.

Synthetic sessions run on the virtual clock of a closed loop (`agent_trace.closed_loop`);
each turn's prompt resends the whole history, answers included. Mooncake conversation
sessions run in trace order on the trace's own clock; a request is paused when its session
has a later turn (the trace does not resend answers, so those turns reuse prompts only).
"""
from __future__ import annotations

import itertools
from array import array

from ..kvcache.pool.layout import shape_layout
from .agent_trace import Session, closed_loop, mooncake_chains
from .sim_cache import CacheSim, prompt_tokens


def _rate(hit: int, tot: int) -> float | None:
    return round(hit / tot, 4) if tot else None


def synthetic_run(sessions: list[Session], concurrency: int, service_s: float, sim: CacheSim,
                  system_tokens: int) -> dict:
    ids = itertools.count(1 << 40)      # unique token ids (the system prompt: 0..)
    hist: dict[int, array] = {}
    by_id = {s.sid: s for s in sessions}
    hit = tot = rhit = rtot = 0
    for ev in closed_loop(sessions, concurrency, service_s):
        t = by_id[ev.sid].turns[ev.turn]
        h = hist.setdefault(ev.sid, array("q", range(system_tokens)))
        h.extend(next(ids) for _ in range(t.new_tokens))
        out = [next(ids) for _ in range(t.output_tokens)]
        got = sim.request(h, t.output_tokens, paused=t.pause_s is not None, now=ev.at,
                          output=out)
        h.extend(out[:t.output_tokens - 1])     # the answer, resent by the next turn
        hit, tot = hit + got, tot + len(h) - len(out[:t.output_tokens - 1])
        if ev.turn:
            rhit, rtot = rhit + got, rtot + len(h) - len(out[:t.output_tokens - 1])
    return {"hit_rate": _rate(hit, tot), "resumed_hit_rate": _rate(rhit, rtot),
            "requests": sim.requests}


def mooncake_run(reqs: list[dict], sim: CacheSim, hold_bound_s: float | None = None) -> dict:
    """Trace order; a request is paused when its session goes on (`mooncake_chains`)."""
    nxt = {}
    for chain in mooncake_chains(reqs):
        for a, b in zip(chain, chain[1:]):
            nxt[a] = b
    resumed = {b for b in nxt.values()}
    hit = tot = rhit = rtot = 0
    for i, r in enumerate(reqs):
        got = sim.request(prompt_tokens(r["hash_ids"], r["input_length"]), r["output_length"],
                          paused=i in nxt, now=r["timestamp"] / 1000.0)
        hit, tot = hit + got, tot + r["input_length"]
        if i in resumed:
            rhit, rtot = rhit + got, rtot + r["input_length"]
    return {"hit_rate": _rate(hit, tot), "resumed_hit_rate": _rate(rhit, rtot),
            "requests": len(reqs), "resumed_requests": len(resumed)}


def simulate(kind: str, data, budgets: list[int], hold_s: float, shape: str, swa_share: float,
             concurrency: int = 0, service_s: float = 0.0, system_tokens: int = 0,
             log=lambda m: None) -> list[dict]:
    """One row per (budget, hold on/off)."""
    hybrid, full_kv = shape_layout(shape), shape_layout(shape, layout="full-kv")
    rows = []
    for budget in budgets:
        for hold in (hold_s, 0.0):
            sim = CacheSim(hybrid, full_kv, budget, "hybrid-output", swa_share=swa_share,
                           hold_s=hold)
            if kind == "synthetic":
                res = synthetic_run(data, concurrency, service_s, sim, system_tokens)
            else:
                res = mooncake_run(data, sim)
            sim.tree.check_integrity()
            row = {"trace": kind, "kv_budget_bytes": budget, "tool_pause_hold_s": hold, **res}
            log(f"sim {kind} {budget / 2**30:g} GiB hold {hold:g}s: hit {res['hit_rate']}, "
                f"resumed {res['resumed_hit_rate']}")
            rows.append(row)
    return rows
