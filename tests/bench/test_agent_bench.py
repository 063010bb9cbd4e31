"""bench agent's parts without servers: the synthetic trace follows its stated distributions
and seed, Mooncake sessions are rebuilt from block prefixes, the closed loop orders turns as
worked out by hand, the metrics match a hand-computed example, and the simulator shows the
paused-session hold keeping resumed turns' hits under pressure."""
from __future__ import annotations

import math

import pytest

from mimo.bench.agent import llama_kv_bytes
from mimo.bench.agent_sim import simulate
from mimo.bench.agent_trace import (
    AgentTraceSpec,
    Session,
    Turn,
    closed_loop,
    metrics,
    mooncake_chains,
    mooncake_sessions,
    percentile,
    synthetic,
)


def test_synthetic_trace_is_seeded_and_within_its_stated_ranges():
    spec = AgentTraceSpec(sessions=200, turns_min=2, turns_max=6, output_tokens=7,
                          pause_s=1.0, pause_max_s=3.0, seed=5)
    a, b = synthetic(spec), synthetic(spec)
    assert a == b and a != synthetic(AgentTraceSpec(sessions=200, seed=6))
    turns = [len(s.turns) for s in a]
    assert min(turns) == 2 and max(turns) == 6          # uniform over [2, 6]: both ends drawn
    assert abs(sum(turns) / len(turns) - 4.0) < 0.3
    for s in a:
        assert s.turns[-1].pause_s is None                 # the last turn answers
        assert all(0 < t.pause_s <= 3.0 for t in s.turns[:-1])
        assert all(t.output_tokens == 7 and t.new_tokens >= 1 for t in s.turns)
    pauses = sorted(t.pause_s for s in a for t in s.turns[:-1] if t.pause_s < 3.0)
    # log-normal with median 1 s (the cap cuts only the top): median within 15%
    assert abs(pauses[len(pauses) // 2] - 1.0) < 0.15 * 1.5
    users = sorted(s.turns[0].new_tokens for s in a)
    assert abs(users[len(users) // 2] - spec.user_tokens) < 0.15 * spec.user_tokens


def test_bad_specs_are_refused():
    with pytest.raises(ValueError):
        AgentTraceSpec(turns_min=3, turns_max=2)
    with pytest.raises(ValueError):
        AgentTraceSpec(concurrency=0)


def test_mooncake_sessions_follow_block_prefixes():
    reqs = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
            {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 9]},
            {"timestamp": 3000, "input_length": 1600, "output_length": 6,
             "hash_ids": [0, 1, 3, 4]},      # continues the first (its full blocks 0, 1)
            {"timestamp": 5000, "input_length": 2100, "output_length": 7,
             "hash_ids": [0, 1, 3, 5, 6]}]   # continues the third (0, 1, 3)
    assert mooncake_chains(reqs) == [[0, 2, 3], [1]]
    (s,) = mooncake_sessions(reqs, limit=5, time_scale=0.5)
    assert [t.pause_s for t in s.turns] == [1.5, 1.0, None]
    assert [t.prompt_tokens for t in s.turns] == [1100, 1600, 2100]


def test_closed_loop_order_by_hand():
    # Two slots, service 1 s. s0: pause 2 then end; s1: ends at once; s2 waits for a slot.
    ss = [Session(0, (Turn(1, 1, 2.0), Turn(1, 1, None))), Session(1, (Turn(1, 1, None),)),
          Session(2, (Turn(1, 1, None),))]
    got = [(e.at, e.sid, e.turn) for e in closed_loop(ss, 2, 1.0)]
    assert got == [(0.0, 0, 0), (0.0, 1, 0), (1.0, 2, 0), (3.0, 0, 1)]


def test_metrics_against_a_hand_computed_example():
    recs = [{"turn": 0, "prompt_tokens": 100, "cached_tokens": 0, "ttft_s": 1.0, "output_tokens": 10},
            {"turn": 1, "prompt_tokens": 200, "cached_tokens": 150, "ttft_s": 2.0, "output_tokens": 10},
            {"turn": 2, "prompt_tokens": 300, "cached_tokens": 250, "ttft_s": 3.0, "output_tokens": 10},
            {"turn": 0, "prompt_tokens": 400, "cached_tokens": 100, "ttft_s": 4.0, "output_tokens": 10}]
    m = metrics(recs, wall_s=8.0)
    assert m["hit_rate"] == 0.5                         # 500 / 1000
    assert m["resumed_hit_rate"] == 0.8                 # 400 / 500
    assert m["ttft_p50_s"] == 2.5 and m["ttft_p90_s"] == 3.7   # ranks 1.5 and 2.7 of 0..3
    assert m["output_tok_s"] == 5.0 and m["requests_per_s"] == 0.5
    assert percentile([], 50) is None and percentile([7.0], 90) == 7.0


def test_llama_kv_bytes_by_hand():
    # 3 global layers x 8192 cells + 15 sliding x 2560 cells, 1 KiB per cell and layer.
    assert llama_kv_bytes(8192, 4) == (3 * 8192 + 15 * 2560) * 1024


def test_the_simulator_shows_the_hold_keeping_resumed_turns_under_pressure():
    spec = AgentTraceSpec(sessions=24, concurrency=8, system_tokens=1024, user_tokens=512,
                          tool_tokens=384, output_tokens=64, pause_s=5.0, pause_max_s=30.0,
                          turns_min=3, turns_max=6, seed=1)
    rows = simulate("synthetic", synthetic(spec), [2 * 2**30], 120.0, "mimo-v2-flash",
                    0.25, spec.concurrency, 2.0, spec.system_tokens)
    on, off = rows
    assert on["tool_pause_hold_s"] == 120.0 and off["tool_pause_hold_s"] == 0.0
    assert not math.isclose(on["resumed_hit_rate"], off["resumed_hit_rate"])
    assert on["resumed_hit_rate"] > off["resumed_hit_rate"]
