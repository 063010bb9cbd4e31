"""cache-sim bench: the JSON contract, hits worked out by hand on a tiny trace, and the real
conversation trace's ideal hit rate. The full replay is the bench's job, not the tests'."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from mimo.bench.__main__ import main
from mimo.bench.sim_cache import (
    CacheSim,
    estimate_swa_share,
    ideal_hit_rates,
    load_trace,
    prompt_tokens,
    size_swa_share,
)
from mimo.kvcache.pool.layout import shape_layout
from mimo.kvcache.radix.retention import POLICIES

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
CONVERSATION = TRACES / "conversation_trace.jsonl"
GiB = 2**30


@pytest.fixture(scope="module")
def conversation():
    if not CONVERSATION.is_file():
        pytest.fail(f"the Mooncake conversation trace is missing: expected it at {CONVERSATION}")
    return CONVERSATION


def layouts(shape="mimo-v2-flash"):
    return shape_layout(shape), shape_layout(shape, layout="full-kv")


def test_ideal_hit_rate_matches_the_trace_readme(conversation):
    ideal = ideal_hit_rates(load_trace(conversation))
    assert round(ideal["ideal_block_hit_rate"], 3) == 0.366      # README table
    assert 0.366 < ideal["ideal_hit_rate"] < 0.38                # the same, token-weighted


def test_prompt_tokens_follow_hash_blocks():
    t = prompt_tokens([7, 3], 600)
    assert len(t) == 600 and t[0] == 7 * 512 and t[511] == 7 * 512 + 511 and t[512] == 3 * 512


def write_trace(path, rows):
    path.write_text("".join(json.dumps(dict(timestamp=0, output_length=o, input_length=n,
                                             hash_ids=h)) + "\n" for h, n, o in rows))
    return path


def test_hits_by_hand(tmp_path):
    """Turn 2 extends turn 1's full blocks; a third conversation shares only the system
    block, where nothing has a window yet; a fourth then hits the branch point it left."""
    trace = write_trace(tmp_path / "t.jsonl", [
        ([0, 1, 2], 1300, 10),        # blocks 0, 1 full; checkpoint at 1024
        ([0, 1, 3, 4], 1600, 10),     # reuses 1024
        ([0, 5], 700, 10),            # shares block 0: token-equal 512, no window there
        ([0, 6, 7], 1100, 10),        # the third left a window at 512 (its branch point)
        ([0, 1, 3, 4], 1600, 10),     # identical to the second: all but the partial block
    ])
    reqs = load_trace(trace)
    hybrid, full_kv = layouts()
    want = {"hybrid": [0, 1024, 0, 512, 1536], "full-kv": [0, 1024, 512, 512, 1536],
            "off": [0] * 5}
    for pol, hits in want.items():
        sim = CacheSim(hybrid, full_kv, 64 * GiB, pol, swa_share=0.2)
        got = [sim.request(prompt_tokens(r["hash_ids"], r["input_length"]), r["output_length"])
               for r in reqs]
        assert got == hits, (pol, got)
        if sim.tree.mode != "off":
            sim.tree.check_integrity()


def test_replay_keeps_the_books_under_eviction(conversation):
    """A small budget on a prefix of the trace: evictions every request, the tree's and the
    pools' invariants checked every 25 requests, nothing held once the replay ends."""
    reqs = load_trace(conversation, limit=150)
    hybrid, full_kv = layouts()
    for pol in ("hybrid", "full-kv"):
        sim = CacheSim(hybrid, full_kv, 20 * GiB, pol, swa_share=0.15)
        res = sim.run(reqs, check_every=25)
        assert res["requests"] == 150 and res["full_bytes"] + res["swa_bytes"] <= 20 * GiB
        assert sim.fa.num_in_use == 0 and res["tree"]["evicted_full"] > 0
        if sim.sa is not None:
            assert sim.sa.num_in_use == 0


def run_cli(argv, capsys):
    rc = main(["cache-sim", *argv])
    out = capsys.readouterr()
    return rc, out.out.strip().splitlines(), out.err


def test_cli_prints_one_json_line_last(conversation, capsys):
    rc, out, err = run_cli(["--trace", str(conversation), "--limit", "600", "--jobs", "2",
                            "--kv-budget", "60GiB,1TiB", "--policy", "hybrid,full-kv,off",
                            "--bound-baseline"], capsys)
    assert rc == 0, err
    res = json.loads(out[-1])
    for k in ("trace", "requests", "shape", "bound", "ideal_hit_rate", "ideal_block_hit_rate",
              "summary", "results", "seconds"):
        assert k in res, k
    assert res["requests"] == 600 and 9 < res["bound"] < 10
    by = {(r["policy"], r["kv_budget_bytes"]): r for r in res["results"]}
    small, huge = 60 * GiB, 2**40
    assert by[("off", small)]["hit_rate"] == 0
    # Unlimited memory: full-kv reaches the ideal (less partial blocks, which are not
    # cached); hybrid loses only forks where no window was kept.
    ideal = res["ideal_hit_rate"]
    assert 0.97 * ideal < by[("full-kv", huge)]["hit_rate"] <= ideal
    assert 0.85 * ideal < by[("hybrid", huge)]["hit_rate"] <= by[("full-kv", huge)]["hit_rate"]
    # Scarce memory: SWA's capacity shows.
    assert by[("hybrid", small)]["hit_rate"] > 1.5 * by[("full-kv", small)]["hit_rate"]
    assert res["summary"]["60GiB"]["hybrid_over_full_kv"] > 1.5
    assert "full_kv_at_bound" in res["summary"]["60GiB"] and "1024GiB" in res["summary"]
    for r in res["results"]:
        assert r["full_bytes"] + r["swa_bytes"] <= r["kv_budget_bytes"]
        if r["policy"] == "hybrid":     # auto: sized by a replay, reported with the result
            assert r["swa_sizing"]["peak_leaves"] > 0 and 0 < r["swa_share"] < 1


def test_dense_grid_override_catches_a_fork_nobody_foresaw(tmp_path, capsys):
    """The second request forks 2048 tokens into the first one's prompt. With no grid the
    only window there is the first prompt's end, so the match is cut to 0 and the cut is
    counted as never kept; a 2048-token grid left a (speculative) window at the fork."""
    trace = write_trace(tmp_path / "t.jsonl", [
        (list(range(9)), 4196, 1), ([0, 1, 2, 3, 20, 21], 3000, 1)])
    res = {}
    for grid in ("0", "2048"):
        # (fill: SWA room beyond the leaves' windows, which speculative windows need)
        rc, out, err = run_cli(["--trace", str(trace), "--kv-budget", "4GiB", "--jobs", "1",
                                "--policy", "hybrid", "--dense-every", grid,
                                "--swa-share", "fill"], capsys)
        assert rc == 0, err
        (r,) = json.loads(out[-1])["results"]
        assert r["retention"]["dense_every"] == int(grid)
        res[grid] = r
    total = 4196 + 3000
    assert res["0"]["hit_tokens"] == 0
    assert res["0"]["window_cut_never_kept_rate"] == round(2048 / total, 4)
    assert res["2048"]["hit_tokens"] == 2048 and res["2048"]["window_cut_rate"] == 0
    assert res["0"]["window_cut_evicted_rate"] == res["2048"]["window_cut_evicted_rate"] == 0
    assert run_cli(["--trace", str(trace), "--dense-every", "-1"], capsys)[0] == 2


def test_cli_rejects_bad_input(tmp_path, capsys):
    assert run_cli(["--trace", str(tmp_path / "none.jsonl")], capsys)[0] == 2
    trace = write_trace(tmp_path / "t.jsonl", [([0], 100, 1)])
    assert run_cli(["--trace", str(trace), "--policy", "lru"], capsys)[0] == 2
    assert run_cli(["--trace", str(trace), "--kv-budget", "lots"], capsys)[0] == 2
    for bad in ("lots", "0", "1.5"):
        rc, out, err = run_cli(["--trace", str(trace), "--swa-share", bad], capsys)
        assert rc == 2 and "--swa-share" in err and not out


def chats_trace(path, n=120, seed=0):
    """n three-turn chats, each turn extending the last, no two chats sharing a block;
    a chat starts every 4 time units and waits 10-200 between turns, so a cache holds the
    recent chats' ends and memory decides how many."""
    rnd, events = random.Random(seed), []
    for c in range(n):
        t = 4.0 * c
        for k in range(3):
            events.append((t, c, k))
            t += rnd.uniform(10, 200)
    rows = [([1000 * c + j for j in range(3 + 2 * k)], 512 * (2 + 2 * k) + 300, 20)
            for _, c, k in sorted(events)]
    return load_trace(write_trace(path, rows))


def test_auto_share_gives_full_kv_all_but_the_leaves_windows(tmp_path):
    """Reuse here is only at cached ends, so SWA beyond the leaves' windows buys nothing.
    The auto share (peak leaves' windows) serves more than the fill-together seed, whose
    extra SWA comes out of the full pool. Below the auto share the SWA pool is what drops
    chats: the full pool never fills, chats go whole for their windows, and hits fall."""
    reqs = chats_trace(tmp_path / "t.jsonl")
    hybrid, full_kv = layouts()
    budget = 3 * GiB
    sized = size_swa_share(reqs, hybrid, full_kv, budget, POLICIES["hybrid"])
    runs = {}
    for name, share in (("auto", sized["swa_share"]), ("seed", sized["seed_share"]),
                        ("below", 0.6 * sized["swa_share"])):
        sim = CacheSim(hybrid, full_kv, budget, "hybrid", swa_share=share)
        runs[name] = (sim.run(reqs, check_every=40), sim.full_short)
    (auto, auto_short), (seed, _), (below, below_short) = runs.values()
    assert sized["swa_share"] < sized["seed_share"] and auto_short > 0
    assert auto["hit_tokens"] > seed["hit_tokens"]
    assert auto["hit_tokens"] > below["hit_tokens"]
    assert below_short == 0 and below["tree"]["evicted_full"] > 0


def test_auto_share_keeps_the_seed_when_the_full_pool_holds_everything(tmp_path):
    """A budget that holds every chat: a smaller SWA pool would only leave full pages
    unused, so the rest of the budget stays with SWA (the fill-together seed)."""
    reqs = chats_trace(tmp_path / "t.jsonl", n=10)
    hybrid, full_kv = layouts()
    sized = size_swa_share(reqs, hybrid, full_kv, 64 * GiB, POLICIES["hybrid"])
    assert sized["peak_leaves"] == 10 and sized["swa_share"] == sized["seed_share"]


def test_plot_needs_matplotlib(tmp_path, capsys, monkeypatch):
    trace = write_trace(tmp_path / "t.jsonl", [([0, 1], 900, 5), ([0, 1, 2], 1200, 5)])
    png = tmp_path / "hit.png"
    args = ["--trace", str(trace), "--kv-budget", "1GiB,4GiB", "--jobs", "1", "--plot", str(png)]
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "matplotlib", None)       # as if not installed
        rc, out, err = run_cli(args, capsys)
        assert rc == 2 and "matplotlib" in err and not out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    rc, out, err = run_cli(args, capsys)
    assert rc == 0 and png.stat().st_size > 1000 and json.loads(out[-1])["requests"] == 2


def test_swa_share_estimate(conversation):
    reqs = load_trace(conversation, limit=2000)
    hybrid, _ = layouts()
    with_out = estimate_swa_share(reqs, hybrid, POLICIES["hybrid-output"])
    prompts = estimate_swa_share(reqs, hybrid, POLICIES["hybrid"])
    assert prompts == estimate_swa_share(reqs, hybrid, POLICIES["hybrid-output"], output=False)
    assert 0.05 < prompts < with_out < 0.3     # windows of output tails cost SWA too


def test_auto_share_is_the_fill_share_when_outputs_are_cached(tmp_path):
    """With outputs cached a next turn may continue inside a sequence (at its prompt end),
    where no leaf count sees it: auto keeps the fill-together share there, and sizes by
    the leaves again once outputs are left out."""
    reqs = chats_trace(tmp_path / "t.jsonl")
    hybrid, full_kv = layouts()
    pol = POLICIES["hybrid-output"]
    fill = estimate_swa_share(reqs, hybrid, pol)
    assert size_swa_share(reqs, hybrid, full_kv, 3 * GiB, pol) == {
        "swa_share": fill, "seed_share": fill, "peak_leaves": None}
    prompts = size_swa_share(reqs, hybrid, full_kv, 3 * GiB, pol, output=False)
    assert prompts["peak_leaves"] > 0
    assert prompts["swa_share"] < estimate_swa_share(reqs, hybrid, pol, output=False)
