"""ConsistentHashRing vs a brute-force definition; stability when workers change."""
from __future__ import annotations

from collections import Counter

from mimo.multimodal.hash_ring import ConsistentHashRing, ring_hash

KEYS = [f"sha256-{i:05d}" for i in range(5000)]


def brute_force(workers, replicas, key):
    """The owner of the first virtual node after the key's hash, wrapping around:
    min over all nodes of the clockwise distance."""
    h = ring_hash(key)
    nodes = [(ring_hash(f"{w}#{i}"), w) for w in workers for i in range(replicas)]
    after = [(p, w) for p, w in nodes if p > h]
    return min(after)[1] if after else min(nodes)[1]


def test_matches_brute_force():
    workers = ["enc-0", "enc-1", "enc-2"]
    ring = ConsistentHashRing(workers, replicas=20)
    for k in KEYS[:400]:
        assert ring.route(k) == brute_force(workers, 20, k)


def test_same_key_same_worker_any_instance():
    a = ConsistentHashRing(["w1", "w2", "w3"])
    b = ConsistentHashRing(["w3", "w1", "w2"])   # order of joining does not matter
    assert all(a.route(k) == b.route(k) == a.route(k) for k in KEYS)


def test_adding_a_worker_moves_few_keys():
    ring = ConsistentHashRing([f"w{i}" for i in range(4)])
    before = {k: ring.route(k) for k in KEYS}
    ring.add("w4")
    after = {k: ring.route(k) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "w4" for k in moved)          # keys only move to the newcomer
    assert 0.10 < len(moved) / len(KEYS) < 0.30          # about 1/5 of them
    ring.remove("w4")
    assert {k: ring.route(k) for k in KEYS} == before    # and back on removal


def test_balance():
    ring = ConsistentHashRing([f"w{i}" for i in range(4)])
    counts = Counter(ring.route(k) for k in KEYS)
    assert max(counts.values()) / min(counts.values()) < 1.5


def test_empty_ring():
    import pytest
    with pytest.raises(LookupError):
        ConsistentHashRing().route("x")
