"""bench encoders: a quick run (two real encoder processes, every cache big enough for every
image) whose hit rates equal what plain counting over the same request sequence says: with
hashing, or with the shared cache, each distinct image misses once; round-robin without it
misses once per (image, encoder) pair, request i going to encoder i mod 2."""
from __future__ import annotations

import json
import random
import subprocess
import sys


def test_hit_rates_match_counting():
    media, requests, seed, n = 30, 90, 5, 2
    out = subprocess.run(
        [sys.executable, "-m", "mimo.bench", "encoders", "--encoders", str(n), "--media",
         str(media), "--requests", str(requests), "--local-items", "64", "--shm-mb", "4",
         "--seed", str(seed)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    rng = random.Random(seed)
    seq = rng.choices(range(media), [1 / (i + 1) ** 0.8 for i in range(media)], k=requests)
    best = 1 - len(set(seq)) / requests
    seen, rr_hits = set(), 0
    for i, m in enumerate(seq):
        rr_hits += (m, i % n) in seen
        seen.add((m, i % n))
    rates = res["hit_rate"]
    assert abs(rates["no_shm_hash"] - best) < 1e-3
    assert abs(rates["shm_hash"] - best) < 1e-3
    assert abs(rates["shm_round-robin"] - best) < 1e-3
    assert abs(rates["no_shm_round-robin"] - rr_hits / requests) < 1e-3
    assert rates["no_shm_round-robin"] < best
    assert res["cpu_flags"] and res["distinct_requested"] == len(set(seq))
