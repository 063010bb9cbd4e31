"""bench route's per-router summary: from the records' worker header (mimo's routers), and from
the workers' own request counts for a router that names no worker (third-party ones)."""
from __future__ import annotations

from mimo.bench.route import summarize


def _recs(workers):
    return [{"session": i // 3, "turn": i % 3, "worker": w, "prompt": 100, "cached": 50,
             "ttft": 0.1 * (i + 1)} for i, w in enumerate(workers)]


def test_from_the_worker_header():
    recs = _recs(["a", "a", "b", "c", "c", "c"])
    s = summarize(recs, ["a", "b", "c", "d"])
    assert s["cached_fraction"] == 0.5
    assert s["max_over_mean"] == 2.0            # 3 of 6 on one of 4 workers
    # session 0: a, a, b (1 of 2 stay); session 1: c, c, c (2 of 2)
    assert s["same_worker_share"] == 0.75


def test_from_the_workers_counts_when_no_router_says():
    recs = _recs([None] * 6)
    s = summarize(recs, ["a", "b", "c", "d"], {"a": 6.0, "b": 0.0, "c": 0.0, "d": 0.0})
    assert s["max_over_mean"] == 4.0            # every request on one worker
    assert s["same_worker_share"] is None
    assert s["requests_per_worker"] == [6.0, 0.0, 0.0, 0.0]


def test_ttft_p90_of_continued_requests():
    recs = _recs(["a"] * 6)               # turns 0, 1, 2 of sessions 0 and 1
    s = summarize(recs, ["a"])
    # ttft 0.1 .. 0.6; the continued ones (turns 1, 2): 0.2, 0.3, 0.5, 0.6
    assert s["ttft_p90"] == 0.6 and s["ttft_p90_continued"] == 0.6
    recs[5]["ttft"] = 0.05
    assert summarize(recs, ["a"])["ttft_p90_continued"] == 0.5
    trace = [{"prev": None, "ttft": 9.0, "prompt": 10, "cached": 0, "worker": "a"},
             {"prev": 0, "ttft": 1.0, "prompt": 10, "cached": 5, "worker": "a"}]
    assert summarize(trace, ["a"])["ttft_p90_continued"] == 1.0
