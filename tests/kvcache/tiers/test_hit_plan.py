"""Where a tiered hit may end, against a brute force over every length: the longest n with
full KV on pages [0, n) and SWA on the window before n * P (window_pages, the L1 rule)."""
import random

from mimo.kvcache.radix.retention import window_pages
from mimo.kvcache.tiers.hit_plan import best_hit


def brute(full_ok, swa_ok, W, P, floor):
    best = floor
    for n in range(len(full_ok) + 1):
        if n > floor and all(full_ok[:n]) and (
                swa_ok is None or all(swa_ok[i] for i in window_pages(n * P, W, P))):
            best = max(best, n)
    return best


def test_best_hit_equals_brute_force():
    rng = random.Random(0)
    for _ in range(3000):
        n = rng.randint(0, 40)
        P, W = rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 5, 8, 16, 33])
        p_full, p_swa = rng.random(), rng.random()
        full_ok = [rng.random() < 0.5 + p_full / 2 for _ in range(n)]
        swa_ok = None if rng.random() < 0.2 else [rng.random() < p_swa for _ in range(n)]
        floor = rng.randint(0, max(n // 3, 0))
        assert best_hit(full_ok, swa_ok, W, P, floor) == brute(full_ok, swa_ok, W, P, floor)
