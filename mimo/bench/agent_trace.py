"""Agent sessions for `bench agent`: a synthetic trace from stated distributions, sessions
rebuilt from the Mooncake conversation trace, the order a closed loop replays them in, and
the metrics of a replay.

A session is a list of turns. Turn k's prompt is the whole history: the shared system
prompt, the first user message, then for every earlier turn its answer and what came back
(a tool's result); every turn but the last ends in a tool call, whose run time is the pause
before the next turn. Synthetic distributions (seeded, `AgentTraceSpec`): turns per session
uniform in [turns_min, turns_max]; user message and tool result lengths log-normal (median,
sigma); answer length fixed; pauses log-normal, capped; `concurrency` sessions at once.

Mooncake sessions: a conversation request continues an earlier one when its blocks start
with all of that request's full blocks (beyond the shared first block); its gap to it is the
pause. The trace does not resend answers (a turn's new blocks hash everything after the
previous prompt), so those turns carry their whole prompt (`Turn.blocks`).
"""
from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AgentTraceSpec:
    sessions: int = 8
    concurrency: int = 4
    turns_min: int = 2
    turns_max: int = 5
    system_tokens: int = 384        # shared by every session (system prompt, tool list)
    user_tokens: float = 128.0      # log-normal median; sigma 0.5
    tool_tokens: float = 96.0       # log-normal median; sigma 0.8
    output_tokens: int = 12         # each answer (a tool call, or the final answer)
    pause_s: float = 1.0            # log-normal median; sigma 0.7
    pause_max_s: float = 6.0
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.turns_min <= self.turns_max:
            raise ValueError("need 1 <= turns_min <= turns_max")
        if self.sessions < 1 or self.concurrency < 1 or self.output_tokens < 1:
            raise ValueError("sessions, concurrency and output_tokens must be >= 1")
        if min(self.user_tokens, self.tool_tokens, self.pause_s) <= 0 or self.pause_max_s < 0:
            raise ValueError("user_tokens, tool_tokens, pause_s must be > 0")


@dataclass(frozen=True)
class Turn:
    new_tokens: int                 # appended before this turn (user message / tool result)
    output_tokens: int
    pause_s: float | None           # the tool's run time after it; None: the last turn
    blocks: tuple[int, ...] = ()    # Mooncake: the prompt's block ids (the whole prompt)
    prompt_tokens: int = 0          # Mooncake: its length


@dataclass(frozen=True)
class Session:
    sid: int
    turns: tuple[Turn, ...]


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def synthetic(spec: AgentTraceSpec) -> list[Session]:
    rng = random.Random(spec.seed)
    out = []
    for sid in range(spec.sessions):
        n = rng.randint(spec.turns_min, spec.turns_max)
        turns = []
        for k in range(n):
            new = round(_lognormal(rng, spec.user_tokens if k == 0 else spec.tool_tokens,
                                   0.5 if k == 0 else 0.8))
            pause = None
            if k < n - 1:
                pause = round(min(_lognormal(rng, spec.pause_s, 0.7), spec.pause_max_s), 3)
            turns.append(Turn(max(new, 1), spec.output_tokens, pause))
        out.append(Session(sid, tuple(turns)))
    return out


def mooncake_chains(reqs: list[dict], block: int = 512) -> list[list[int]]:
    """Request indices per conversation, in trace order: a request continues the latest
    earlier request whose full blocks it starts with (more than the shared first block)."""
    chains: list[list[int]] = []
    by_prefix: dict[tuple, int] = {}
    for i, r in enumerate(reqs):
        h, full = r["hash_ids"], r["input_length"] // block
        sid = None
        for k in range(min(len(h) - 1, full), 1, -1):
            sid = by_prefix.pop(tuple(h[:k]), None)
            if sid is not None:
                break
        if sid is None:
            sid = len(chains)
            chains.append([])
        chains[sid].append(i)
        by_prefix[tuple(h[:full])] = sid
    return chains


def mooncake_sessions(reqs: list[dict], limit: int, min_turns: int = 2,
                      time_scale: float = 1.0, pause_max_s: float | None = None) -> list[Session]:
    """The first `limit` conversations of at least `min_turns` turns (`mooncake_chains`).
    Pauses are the gaps between turns times `time_scale`, capped at `pause_max_s`."""
    out: list[Session] = []
    for chain in mooncake_chains(reqs):
        if len(chain) < min_turns:
            continue
        turns = []
        for k, i in enumerate(chain):
            r, pause = reqs[i], None
            if k + 1 < len(chain):
                pause = (reqs[chain[k + 1]]["timestamp"] - r["timestamp"]) / 1000.0 * time_scale
                pause = min(pause, pause_max_s) if pause_max_s is not None else pause
            turns.append(Turn(0, max(r["output_length"], 1), pause, tuple(r["hash_ids"]),
                              r["input_length"]))
        out.append(Session(len(out), tuple(turns)))
        if len(out) >= limit:
            break
    return out


@dataclass(order=True)
class Scheduled:
    at: float
    sid: int
    turn: int = field(compare=False)


def closed_loop(sessions: list[Session], concurrency: int, service_s: float) -> list[Scheduled]:
    """Turns in the order a closed loop of `concurrency` sessions sends them, on a virtual
    clock where every turn takes `service_s`: a session's next turn comes its pause after
    the answer; a session that ends starts the next one."""
    heap = [Scheduled(0.0, s.sid, 0) for s in sessions[:concurrency]]
    heapq.heapify(heap)
    by_id = {s.sid: s for s in sessions}
    waiting = [s.sid for s in sessions[concurrency:]][::-1]
    out = []
    while heap:
        ev = heapq.heappop(heap)
        out.append(ev)
        t = by_id[ev.sid].turns[ev.turn]
        done = ev.at + service_s
        if t.pause_s is not None:
            heapq.heappush(heap, Scheduled(done + t.pause_s, ev.sid, ev.turn + 1))
        elif waiting:
            heapq.heappush(heap, Scheduled(done, waiting.pop(), 0))
    return out


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def metrics(records: list[dict], wall_s: float) -> dict:
    """Per-turn records {turn, prompt_tokens, cached_tokens, ttft_s, output_tokens} ->
    hit rate (cached prompt tokens / prompt tokens) overall and on resumed turns (turn > 0),
    TTFT p50/p90 and throughput over the replay's wall time."""
    def rate(rs):
        p = sum(r["prompt_tokens"] for r in rs)
        return None if not p else round(sum(r["cached_tokens"] for r in rs) / p, 4)
    ttft = [r["ttft_s"] for r in records if r.get("ttft_s") is not None]
    p50, p90 = percentile(ttft, 50), percentile(ttft, 90)
    return {"requests": len(records),
            "prompt_tokens": sum(r["prompt_tokens"] for r in records),
            "cached_tokens": sum(r["cached_tokens"] for r in records),
            "hit_rate": rate(records),
            "resumed_hit_rate": rate([r for r in records if r["turn"] > 0]),
            "ttft_p50_s": None if p50 is None else round(p50, 4),
            "ttft_p90_s": None if p90 is None else round(p90, 4),
            "output_tok_s": round(sum(r["output_tokens"] for r in records) / wall_s, 3)
            if wall_s > 0 else None,
            "requests_per_s": round(len(records) / wall_s, 4) if wall_s > 0 else None,
            "wall_s": round(wall_s, 2)}
