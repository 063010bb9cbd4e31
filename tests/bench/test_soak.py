"""soak bench: its pure helpers, and one small real run against a real server."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from mimo.bench.soak import (
    StallTracker,
    Workload,
    build_requests,
    draw_cut,
    metric_by,
    metric_sum,
    parse_metrics,
)

ROOT = Path(__file__).resolve().parents[2]


def test_requests_share_prefixes_and_respect_bounds():
    w = Workload(num_requests=400, prefixes=4, max_prompt_tokens=300, max_tokens=12,
                 long_fraction=0.1, long_max_tokens=40, seed=3)
    reqs = build_requests(w)
    assert reqs == build_requests(w)                       # deterministic per seed
    ids = [r for r in reqs if not r["text"]]
    assert ids and any(r["text"] for r in reqs)
    for r in reqs:
        assert 1 <= r["n"] <= 300 and 0 <= r["cut"] <= r["n"]
        if r["text"]:
            assert len(r["prompt"].split()) == r["n"]
        else:
            assert len(r["prompt"]) == r["n"] and all(100 <= t < 20000 for t in r["prompt"])
        if r["long"]:
            assert r["n"] >= 270 and 13 <= r["max_tokens"] <= 40
        else:
            assert 1 <= r["max_tokens"] <= 12
        if r["action"] == "disconnect":
            assert r["stream"] and r["after_chunks"] is not None
        if r["action"] == "timeout":
            assert not r["stream"] and 0.2 <= r["cancel_after_s"] <= 1.0
    # two token-id prompts on the same prefix agree up to the shorter cut
    by_prefix = {}
    for r in ids:
        by_prefix.setdefault(r["prefix"], []).append(r)
    a, b = sorted(max(by_prefix.values(), key=len), key=lambda r: -r["cut"])[:2]
    assert a["prompt"][:b["cut"]] == b["prompt"][:b["cut"]]
    streamed = [r for r in reqs if r["stream"]]
    assert 0.15 < sum(r["action"] == "disconnect" for r in streamed) / len(streamed) < 0.45
    assert any(r["after_chunks"] == 0 for r in streamed)   # some hang up before the first token
    assert any(r["action"] == "timeout" for r in reqs)


def test_cuts_land_on_page_boundaries_often():
    rng = random.Random(0)
    cuts = [draw_cut(rng, n, 16) for n in [rng.randint(1, 1500) for _ in range(2000)]]
    near = sum(min(c % 16, 16 - c % 16) <= 1 for c in cuts) / len(cuts)
    assert near > 0.45                                     # 3 of 16 residues by chance: 0.19


def test_parse_metrics_labels_and_sums():
    text = """# HELP mimo_kv_pool_pages KV pool pages by state
# TYPE mimo_kv_pool_pages gauge
mimo_kv_pool_pages{pool="full",state="in_use"} 3.0
mimo_kv_pool_pages{pool="swa",state="in_use"} 0.0
mimo_kv_pool_pages{pool="swa",state="free"} 120.0
mimo_requests_total{endpoint="completions",status="200"} 7.0
mimo_requests_total{endpoint="chat",status="200"} 2.0
mimo_requests_total{endpoint="completions",status="499"} 1.0
mimo_requests_created{endpoint="completions",status="200"} 1.7e+09
mimo_weird{a="x,y=\\"z\\"",b="2"} 5 1700000000
mimo_engine_steps 42.0
"""
    m = parse_metrics(text)
    assert metric_by(m, "mimo_kv_pool_pages", "pool", state="in_use") == {"full": 3.0, "swa": 0.0}
    assert metric_by(m, "mimo_requests_total", "status") == {"200": 9.0, "499": 1.0}
    assert metric_sum(m, "mimo_engine_steps") == 42.0
    assert metric_sum(m, "mimo_preemptions_total") is None
    assert m["mimo_weird"] == [({"a": 'x,y="z"', "b": "2"}, 5.0)]


def test_stall_tracker_counts_only_busy_time_without_steps():
    s = StallTracker()
    s.observe(0.0, 10, True)
    s.observe(1.0, 11, True)
    s.observe(2.0, 11, True)
    s.observe(4.5, 11, True)            # no step from 1.0 to 4.5 while busy
    s.observe(5.0, 12, True)
    s.observe(6.0, 12, False)           # idle: not a stall
    s.observe(20.0, 12, False)
    s.observe(21.0, 12, True)
    s.observe(22.0, 12, True)
    assert s.max_stall == 3.5 and s.current(22.0) == 1.0


def test_soak_small_real_run():
    cmd = [sys.executable, "-m", "mimo.bench", "soak", "--num-requests", "40",
           "--max-prompt-tokens", "200", "--max-tokens", "8", "--long-max-tokens", "24",
           "--long-fraction", "0.1", "--min-concurrency", "4", "--max-concurrency", "8",
           "--request-timeout", "120", "--timeout", "400", "--seed", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    lines = p.stdout.strip().splitlines()
    assert lines, p.stderr[-3000:]
    res = json.loads(lines[-1])
    assert res["ok"] is True and p.returncode == 0, (res["fail_reasons"], res["outcomes"],
                                                      res["failures"], p.stderr[-2000:])
    c = res["outcomes"]
    assert sum(c[k] for k in ("completed", "error", "disconnected", "timed_out")) == 40
    assert c["stuck"] == c["failed"] == c["not_sent"] == 0 and c["completed"] >= 20
    assert c["disconnected"] >= 1
    assert res["kv_in_use_idle"] and all(v == 0 for v in res["kv_in_use_idle"].values())
    assert res["fds_end"] <= res["fds_start"] and res["threads_end"] <= res["threads_start"]
    assert res["max_step_stall_s"] < 10 and res["requests_by_status"]["200"] >= c["completed"]
