"""SharedEmbedCache: one segment in /dev/shm shared by processes. Checked against a plain
Python model of its ring (FIFO by bytes and by slots), across real processes (values
derived from their keys, so a wrong hit is visible), with corrupt entries (a miss, never
wrong bytes), and with a user SIGKILLed (its stale segment reclaimed at the next start; the
last user leaves nothing in /dev/shm)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

from mimo.multimodal.shm_cache import SharedEmbedCache, layout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = [0] if os.environ.get("CI") else range(4)


@pytest.fixture
def name():
    n = f"mimo-test-{uuid.uuid4().hex[:12]}"
    yield n
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith(n)]
    for f in leftovers:
        os.unlink(os.path.join("/dev/shm", f))
    assert not leftovers, f"left in /dev/shm: {leftovers}"


def files(name: str) -> list[str]:
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(name))


def value_of(key: str, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(int.from_bytes(key.encode()[-6:], "little"))
    return torch.randn(rows, 8, generator=g)


class RingModel:
    """What the cache should hold: entries placed at a byte cursor that wraps to 0 when the
    next one does not fit, in slots taken in order; a new entry evicts every entry whose
    bytes it overlaps or whose slot it takes."""

    def __init__(self, slots: int, data: int):
        self.slots, self.data, self.cursor, self.seq = slots, data, 0, 0
        self.entries: dict[str, tuple[int, int, int]] = {}      # key -> (off, n, slot)

    def put(self, key: str, n: int) -> None:
        if key in self.entries or n > self.data:
            return
        self.seq += 1
        if self.cursor + n > self.data:
            self.cursor = 0
        slot = self.seq % self.slots
        self.entries = {k: (o, m, s) for k, (o, m, s) in self.entries.items()
                        if s != slot and not (o < self.cursor + n and o + m > self.cursor)}
        self.entries[key] = (self.cursor, n, slot)
        self.cursor += n


@pytest.mark.parametrize("seed", SEEDS)
def test_hits_and_evictions_follow_the_ring_model(name, seed):
    rng = random.Random(seed)
    cap = 1 << 20
    slots, data = layout(cap)
    model = RingModel(slots, data)
    a = SharedEmbedCache(name, cap, "fp")
    b = SharedEmbedCache(name, 5 * cap, "fp")        # joins: the existing size holds
    assert (b.slots, b.data_bytes) == (slots, data)
    keys = [f"k{i}" for i in range(120)]
    try:
        for _ in range(600):
            key = rng.choice(keys)
            rows = 1 + int.from_bytes(key.encode(), "little") % 3000
            if rng.random() < 0.5:
                (a if rng.random() < 0.5 else b).put(key, value_of(key, rows))
                model.put(key, rows * 8 * 4)
            else:
                got = (a if rng.random() < 0.5 else b).get(key)
                assert (got is not None) == (key in model.entries), key
                if got is not None:
                    assert torch.equal(got, value_of(key, rows))
        assert a.shared_stats()["entries"] == len(model.entries)
    finally:
        a.close()
        assert files(name)                   # b still uses it
        b.close()
    assert files(name) == []


def test_other_fingerprint_misses_and_dtypes_round_trip(name):
    with SharedEmbedCache(name, 1 << 20, "model-a") as a, \
            SharedEmbedCache(name, 1 << 20, "model-b") as b:
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            t = torch.randn(5, 7).to(dt)
            assert a.put(f"img-{dt}", t)
            got = a.get(f"img-{dt}")
            assert got.dtype == dt and torch.equal(got, t)
            assert b.get(f"img-{dt}") is None          # another model's embeddings
        assert not a.put("too-big", torch.zeros(1 << 19))   # 2 MiB > the ring
        assert not a.put("int", torch.zeros(3, dtype=torch.int64))


def test_a_corrupt_entry_is_a_miss(name):
    with SharedEmbedCache(name, 1 << 20, "fp") as c:
        t = torch.arange(64, dtype=torch.float32).reshape(8, 8)
        c.put("x", t)
        c.put("y", t + 1)
        # Flip one byte of x's data, as a torn overwrite would leave it.
        with open(f"/dev/shm/{name}.seg", "r+b") as f:
            f.seek(c._data0 + 3)
            byte = f.read(1)
            f.seek(c._data0 + 3)
            f.write(bytes([byte[0] ^ 0x40]))
        assert c.get("x") is None
        assert c.get("x") is None                      # dropped for good
        assert torch.equal(c.get("y"), t + 1)          # the rest is intact


WORKER = textwrap.dedent("""
    import sys, random, torch
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from mimo.multimodal.shm_cache import SharedEmbedCache
    from multimodal.test_shm_cache import value_of
    c = SharedEmbedCache({name!r}, 1 << 20, "fp")
    rng = random.Random({seed})
    hits = 0
    for _ in range(400):
        k = "k%d" % rng.randrange(60)
        rows = 1 + int.from_bytes(k.encode(), "little") % 2000
        got = c.get(k)
        if got is None:
            c.put(k, value_of(k, rows))
        else:
            assert torch.equal(got, value_of(k, rows)), k
            hits += 1
    print("hits", hits, flush=True)
    if {hold}:
        print("holding", flush=True)
        sys.stdin.read()
    c.close()
""")


def _worker(name: str, seed: int, hold: bool = False) -> subprocess.Popen:
    code = WORKER.format(root=ROOT, tests=os.path.join(ROOT, "tests"), name=name, seed=seed,
                         hold=hold)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)


def test_processes_share_entries_and_never_see_wrong_ones(name):
    procs = [_worker(name, s) for s in (1, 2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum(int(o.split()[1]) for o in outs) > 0
    assert files(name) == []                 # the last one out removed the segment


def test_a_killed_users_segment_is_reclaimed_and_removed(name):
    p = _worker(name, 3, hold=True)
    assert p.stdout.readline().startswith("hits")
    assert p.stdout.readline().strip() == "holding"
    with SharedEmbedCache(name, 1 << 20, "fp") as live:      # joins the killed one's segment
        assert not live.reclaimed and live.shared_stats()["entries"] > 0
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    # `live` was the last user: it cleaned up although p never detached.
    assert files(name) == []
    p = _worker(name, 4, hold=True)
    p.stdout.readline()
    p.stdout.readline()
    os.kill(p.pid, signal.SIGKILL)
    p.wait(30)
    assert files(name) == [f"{name}.lock", f"{name}.seg", f"{name}.users"]    # stale
    with SharedEmbedCache(name, 1 << 20, "fp") as again:
        assert again.reclaimed
        assert again.shared_stats()["entries"] == 0
        assert again.get("k1") is None
    assert files(name) == []


WRITER = textwrap.dedent("""
    import sys, random, torch
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from mimo.multimodal.shm_cache import SharedEmbedCache
    from multimodal.test_shm_cache import value_of
    c = SharedEmbedCache({name!r}, 8 << 20, "fp")
    rng = random.Random({seed})
    print("writing", flush=True)
    while True:                                  # until SIGKILLed, most likely mid-put
        k = "w%d" % rng.randrange(200)
        c.put(k, value_of(k, 20000 + int.from_bytes(k.encode(), "little") % 20000))
""")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_writer_killed_mid_put_leaves_no_wrong_entry(name, seed):
    """The segment outlives the writer (this process holds it): whatever the kill
    interrupted is a miss, every hit is the right value, and the lock is free."""
    rng = random.Random(seed)
    with SharedEmbedCache(name, 8 << 20, "fp") as c:
        for _ in range(2):
            code = WRITER.format(root=ROOT, tests=os.path.join(ROOT, "tests"), name=name,
                                 seed=rng.randrange(1 << 30))
            p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "writing"
            time.sleep(rng.uniform(0.2, 0.8))
            p.send_signal(signal.SIGKILL)
            p.wait(30)
            p.stdout.close()
            hits = 0
            for i in range(200):
                k = f"w{i}"
                got = c.get(k)
                if got is not None:
                    hits += 1
                    assert torch.equal(got, value_of(k, 20000 + int.from_bytes(
                        k.encode(), "little") % 20000)), k
            assert hits > 0
        assert not c.reclaimed
