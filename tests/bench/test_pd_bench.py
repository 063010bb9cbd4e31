"""bench pd: its figures' arithmetic on hand-made records and counters, and a quick run on a
tiny MiMo-V2-Flash (real workers and routers) whose JSON carries every field, whose answers
agree between the arms, and whose KV bytes are the full layers' pages and the SWA windows of
exactly the workload's prompts (plain arithmetic over the model's shape)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from mimo.bench.pd_workload import (
    Workload,
    pct,
    requests,
    same_tokens,
    summarize,
    transfer_figures,
)


def _rec(kind, ttft, times, text="x", out=3):
    return {"kind": kind, "ttft": ttft, "times": times, "text": text, "out": out}


def test_percentiles_and_latencies_by_hand():
    assert pct([], 50) is None
    assert pct([5.0, 1.0, 3.0, 2.0], 50) == 2.0     # ceil(0.5 * 4) = 2nd smallest
    assert pct([5.0, 1.0, 3.0, 2.0], 90) == 5.0     # ceil(3.6) = 4th
    assert pct(list(range(1, 11)), 90) == 9         # ceil(9.0) = 9th
    recs = [_rec("short", 0.5, [1.0, 1.1, 1.3]),       # gaps 0.1, 0.2
            _rec("short", 0.25, [2.0, 2.4]),            # gap 0.4
            _rec("long", 2.0, [4.0, 4.05, 4.15, 4.45]),  # gaps 0.05, 0.1, 0.3
            {**_rec("short", 9.0, [1.0, 9.0]), "error": "HTTP 500"}]
    s = summarize(recs)
    assert (s["requests"], s["errors"]) == (4, 1)
    assert s["ttft"] == {"p50": 0.5, "p90": 2.0}              # of 0.25, 0.5, 2.0
    # gaps 0.05 0.1 0.1 0.2 0.3 0.4: p50 the 3rd, p90 the ceil(5.4) = 6th
    assert s["itl"]["p50"] == pytest.approx(0.1) and s["itl"]["p90"] == pytest.approx(0.4)
    assert s["short"]["ttft"] == {"p50": 0.25, "p90": 0.5}
    assert s["short"]["itl"]["p50"] == pytest.approx(0.2)     # of 0.1, 0.2, 0.4
    assert s["long"]["itl"]["p90"] == pytest.approx(0.3)


def test_same_tokens_and_transfer_figures_by_hand():
    a = [_rec("short", 1, [], "ab", 2), _rec("long", 1, [], "c", 1)]
    assert same_tokens(a, [dict(r) for r in a]) == (True, [])
    assert same_tokens(a, [a[0], {**a[1], "text": "d"}]) == (False, [1])
    assert same_tokens(a, [{**a[0], "out": 3}, a[1]]) == (False, [0])
    assert same_tokens(a, [a[0], {**a[1], "error": "HTTP 500"}]) == (False, [1])
    assert same_tokens(a, a[:1]) == (False, [1])
    zero = {"transfers": 0, "failed": 0, "recomputed": 0, "import_recomputed": 0,
            "wire_bytes": 0, "kv_bytes": 0,
            "full_kv_bytes": 0, "seconds": 0.0, "prefill_seconds": 0.0, "send_seconds": 0.0,
            "send_tail_seconds": 0.0}
    pre0 = {"sent": {**zero, "prefill_seconds": 1.0, "send_seconds": 0.5,
                     "send_tail_seconds": 0.25}}
    pre1 = {"sent": {**zero, "prefill_seconds": 11.0, "send_seconds": 0.7,
                     "send_tail_seconds": 0.3}}
    dec0 = {"received": {**zero, "transfers": 1, "wire_bytes": 100, "full_kv_bytes": 400,
                         "seconds": 2.0}}
    dec1 = {"received": {**zero, "transfers": 4, "wire_bytes": 1100, "kv_bytes": 900,
                         "full_kv_bytes": 4400, "seconds": 14.5, "recomputed": 1}}
    t = transfer_figures(pre0, pre1, dec0, dec1)
    assert (t["transfers"], t["recomputed"], t["wire_bytes"]) == (3, 1, 1000)
    assert t["kv_bytes_ratio"] == 0.25                       # 1000 / 4000
    assert t["transfer_fraction"] == pytest.approx(0.02)     # 0.2 s sending / 10 s prefill
    assert t["send_tail_s"] == pytest.approx(0.05)
    assert t["transfer_overhead_fraction"] == pytest.approx(0.25)   # (12.5 - 10) / 10


def test_kv_dtype_read_from_the_counted_bytes():
    from mimo.bench.pd import _kv_dtype
    per_token = 18 * 2 * 256                   # gemma-3-270m: 18 layers, K and V of 256
    assert _kv_dtype("gemma-3-270m", per_token * 4 * 700, 700) == "float32"
    assert _kv_dtype("gemma-3-270m", per_token * 2 * 700, 700) == "bfloat16"


def test_workload_is_seeded_and_as_stated():
    w = Workload(short=20, long=5, seed=3)
    r = requests(w)
    assert r == requests(w) and r != requests(Workload(short=20, long=5, seed=4))
    assert [x["at"] for x in r] == sorted(x["at"] for x in r)
    short = [x for x in r if x["kind"] == "short"]
    long = [x for x in r if x["kind"] == "long"]
    assert len(short) == 20 and len(long) == 5
    assert all(w.short_lo <= len(x["prompt"]) <= w.short_hi for x in short)
    assert all(len(x["prompt"]) == w.long_tokens and x["max_tokens"] == w.long_max_tokens
               for x in long)


def _window_bytes(n: int, page: int = 16, window: int = 7, dtype_bytes: int = 4) -> int:
    """Tiny MiMo-V2-Flash's KV for an n-token prompt as moved: 2 full layers (1 KV head,
    K 24 + V 16) on every page; 4 SWA + 2 MTP layers (2 KV heads, 24 + 16; mimo keeps the
    MTP layers' KV SWA-shaped) on the pages from (n - window) // page on."""
    pages = math.ceil(n / page)
    first = max(0, n - window) // page
    return (2 * 40 * pages * page + 6 * 80 * (pages - first) * page) * dtype_bytes


def test_quick_run_reports_every_figure(tmp_path):
    png = tmp_path / "pd.png"
    p = subprocess.run([sys.executable, "-m", "mimo.bench", "pd", "--quick", "--plot", str(png),
                        "--server-args", "--dtype float32"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["bench"] == "pd" and out["cpu"] and isinstance(out["cpu_flags"], list)
    assert out["same_tokens"] is True and out["differing"] == {"pd": [], "colocated": []}
    prompts = [len(r["prompt"]) for r in requests(Workload(**out["workload"]))]
    t = out["pd"]["transfer"]
    assert t["transfers"] == len(prompts)
    assert t["failed"] == t["recomputed"] == t["import_recomputed"] == 0
    assert t["kv_bytes"] == sum(_window_bytes(n) for n in prompts)
    assert t["full_kv_bytes"] == sum(n * (2 * 40 + 6 * 80) * 4 for n in prompts)
    assert 0 < t["wire_bytes"] - t["kv_bytes"] < 4096 * len(prompts)
    assert out["kv_bytes_ratio"] == round(t["wire_bytes"] / t["full_kv_bytes"], 4) < 0.5
    assert 0 < out["transfer_fraction"] == t["transfer_fraction"]
    for arm in ("pd", "colocated"):
        s = out[arm]
        assert s["errors"] == 0 and s["requests"] == len(prompts) and s["pools_idle"]
        for part in (s, s["short"], s["long"]):
            assert 0 < part["ttft"]["p50"] <= part["ttft"]["p90"]
            # Tokens that reach the client in one read have gaps of 0 (after rounding to
            # 0.1 ms): a median of 0 is a measurement, not a missing one.
            assert 0 <= part["itl"]["p50"] <= part["itl"]["p90"] and part["itl"]["p90"] > 0
    # The router's choice is cache- and load-aware: with the quick workload's few, spaced
    # requests, whether the second colocated worker gets one depends on how they overlap
    # (all five once went to one worker in a full suite run). Each request was served by
    # one of the arm's workers; PD's all by its decode worker.
    co = out["colocated"]
    assert len(co["workers"]) == 2 and 1 <= len(co["served_by"]) <= 2
    assert set(co["served_by"]) <= set(co["workers"])
    assert len(out["pd"]["served_by"]) == 1 and out["pd"]["served_by"][0] in out["pd"]["workers"]
    assert png.stat().st_size > 10_000


def test_transport_bench_moves_the_payload_both_ways():
    """bench pd-transport: the direct stream and the Redis path both deliver the payload bit
    for bit (checked inside), of the size layout arithmetic gives."""
    from mimo.bench.pd_transport import measure
    out = measure("gemma-3-270m", [600], "float32", 16, reps=1)
    row = out["rows"][0]
    per_layer_token = 2 * 256 * 4                  # K and V, 1 KV head of 256, float32
    pages = math.ceil(600 / 16)                    # 38
    window_pages = pages - (600 - 512) // 16       # 33: positions 80.. on whole pages
    kv = per_layer_token * 16 * (3 * pages + 15 * window_pages)
    assert 0 < row["wire_bytes"] - kv < 4096
    assert row["full_kv_bytes"] == 18 * per_layer_token * 600
    assert out["bit_exact"] and row["direct_s"] > 0 and row["redis_put_s"] > 0
    assert row["redis_s"] == pytest.approx(row["redis_put_s"] + row["redis_get_s"], abs=2e-4)
