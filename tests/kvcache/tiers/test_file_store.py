"""The file store's own behaviour: the byte cap and its LRU order, min_age, surviving a
reopen, a read that blocks past the deadline, a real full disk (ENOSPC), temp files."""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

import pytest

from mimo.kvcache.tiers import entry
from mimo.kvcache.tiers.file_store import FileStore

T = 5.0
PAYLOAD = 1000
SIZE = entry.HEADER_SIZE + PAYLOAD      # bytes on disk per entry


def _val(i: int) -> bytes:
    return bytes([i % 256]) * PAYLOAD


def run(store: FileStore, coro_fn):
    async def main():
        try:
            return await coro_fn()
        finally:
            await store.aclose()
    return asyncio.run(main())


def test_lru_eviction_order(tmp_path):
    store = FileStore(str(tmp_path), disk_cap=10 * SIZE, min_age=0.0)
    keys = [f"k{i}" for i in range(16)]

    async def body():
        for i in range(10):                 # one batch each: a strict age order
            assert await store.put([(keys[i], _val(i))], T) == [True]
        await store.touch([keys[0], keys[1]], T)            # keep-alive: now the youngest
        assert await store.get([keys[2]], T) == [_val(2)]   # a hit refreshes too
        assert await store.put([(k, _val(10 + j)) for j, k in enumerate(keys[10:14])], T) \
            == [True] * 4
        return await store.exists(keys, T)

    alive = run(store, body)
    # 4 evicted, oldest first: k3..k6; the touched k0, k1 and the hit k2 stay
    assert alive == [True, True, True] + [False] * 4 + [True] * 7 + [False, False]
    assert store.total_bytes == 10 * SIZE
    store.check_integrity()
    assert store.stats.dropped == 0


def test_rewriting_a_key_at_the_cap_evicts_nothing(tmp_path):
    store = FileStore(str(tmp_path), disk_cap=3 * SIZE, min_age=0.0)

    async def body():
        for k in "abc":
            await store.put([(k, _val(1))], T)
        assert await store.put([("b", _val(2))], T) == [True]
        return await store.get(list("abc"), T)

    assert run(store, body) == [_val(1), _val(2), _val(1)]
    store.check_integrity()


def test_writes_dropped_at_the_cap_when_everything_is_young(tmp_path):
    store = FileStore(str(tmp_path), disk_cap=3 * SIZE, min_age=3600.0)

    async def body():
        first = await store.put([(f"k{i}", _val(i)) for i in range(5)], T)
        too_big = await store.put([("huge", b"x" * (3 * SIZE))], T)
        return first, too_big, await store.get([f"k{i}" for i in range(5)], T)

    first, too_big, got = run(store, body)
    assert first == [True, True, True, False, False] and too_big == [False]
    assert got == [_val(0), _val(1), _val(2), None, None]
    s = store.stats
    assert (s.stored, s.dropped, s.errors["full"]) == (3, 3, 3)
    assert sum(s.errors.values()) == 3
    store.check_integrity()


def test_survives_reopening_with_mtime_as_age(tmp_path):
    first = FileStore(str(tmp_path))
    items = [(f"page/{i}", os.urandom(100 + 7 * i)) for i in range(20)]
    assert run(first, lambda: first.put(items, T)) == [True] * 20
    # entries written at different times by an earlier process: page/5 the oldest
    now = time.time()
    for i, (k, _) in enumerate(items):
        age = 1000.0 if i == 5 else 100.0 - i
        os.utime(first.path_of(k), (now - age, now - age))
    total = first.total_bytes

    second = FileStore(str(tmp_path), disk_cap=total, min_age=10.0)
    second.check_integrity()                # the index rebuilt from the directory
    assert second.total_bytes == total

    async def body():
        got = await second.get([k for k, _ in items[:3]], T)
        stored = await second.put([("new", b"n" * 100)], T)    # needs room: evicts page/5
        return got, stored, await second.exists([k for k, _ in items], T)

    got, stored, alive = run(second, body)
    assert got == [v for _, v in items[:3]] and stored == [True]
    assert alive == [i != 5 for i in range(20)]
    assert os.path.getmtime(second.path_of("page/0")) > now - 10     # the hit set its age
    second.check_integrity()


def test_two_stores_share_a_directory(tmp_path):
    a, b = FileStore(str(tmp_path)), FileStore(str(tmp_path))

    async def body():
        await b.get(["x"], T)               # b's index is built before a writes
        assert await a.put([("x", b"shared")], T) == [True]
        got = await b.get(["x"], T)
        await a.aclose()
        return got

    assert run(b, body) == [b"shared"]
    a.check_integrity()
    b.check_integrity()                     # b adopted the entry it found on disk


def test_a_read_blocked_past_the_deadline_is_a_timeout(tmp_path):
    store = FileStore(str(tmp_path))
    fifo = store.path_of("blocked")

    async def body():
        assert await store.put([("before", b"1"), ("blocked", b"2"), ("after", b"3")], T)
        os.unlink(fifo)
        os.mkfifo(fifo)                     # opening it for reading blocks until a writer
        got = await asyncio.wait_for(store.get(["before", "blocked", "after"], 1.0), 10)
        # unblock the pool thread: a writer that writes nothing, so the read sees EOF
        await asyncio.wait_for(asyncio.to_thread(lambda: os.close(os.open(fifo, os.O_WRONLY))),
                               10)
        return got

    assert run(store, body) == [b"1", None, None]
    s = store.stats
    assert s.errors["timeout"] == 2 and s.hits == 1 and s.misses == 2


def test_stale_temp_files_are_removed_young_ones_kept(tmp_path):
    shard = tmp_path / "ab"
    shard.mkdir()
    old, young = shard / ("ab" + "0" * 30 + ".1.2.tmp"), shard / ("ab" + "1" * 30 + ".1.3.tmp")
    old.write_bytes(b"partial")
    young.write_bytes(b"in flight")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    store = FileStore(str(tmp_path))
    assert run(store, lambda: store.get(["k"], T)) == [None]
    assert not old.exists() and young.exists()
    store.check_integrity()


_ENOSPC_SCRIPT = r"""
import asyncio, json, os, sys
from mimo.kvcache.tiers.file_store import FileStore

async def main(root):
    store = FileStore(root)
    ok = await store.put([(f"k{i}", os.urandom(60_000)) for i in range(8)], 5.0)
    got = await store.get([f"k{i}" for i in range(8)], 5.0)
    await store.aclose()
    store.check_integrity()
    leftovers = [f for _, _, fs in os.walk(root) for f in fs if f.endswith(".tmp")]
    print(json.dumps({"ok": ok, "hit": [g is not None for g in got], "leftovers": leftovers,
                      "errors": store.stats.errors, "dropped": store.stats.dropped}))

asyncio.run(main(sys.argv[1]))
"""


def test_a_full_disk_drops_writes_counted_full(tmp_path):
    """A real ENOSPC: a 256 KiB tmpfs, mounted in a private mount namespace (unshare), so it
    needs no privileges and vanishes with the process."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to mount a small tmpfs")
    root = tmp_path / "small"
    root.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(_ENOSPC_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
         f'mount -t tmpfs -o size=256k tmpfs "$1" && exec "{sys.executable}" "$2" "$1"',
         "sh", str(root), str(script)],
        capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    n_ok = sum(r["ok"])
    assert 0 < n_ok < 8                     # 256 KiB holds a few 60 KB entries, not 8
    assert r["hit"] == r["ok"]              # what was stored reads back, nothing else
    assert r["errors"]["full"] == 8 - n_ok == r["dropped"]
    assert r["leftovers"] == []             # the partial temp files were removed


def test_a_wiped_directory_is_recreated(tmp_path):
    root = tmp_path / "kv"
    store = FileStore(str(root))

    async def body():
        assert await store.put([("a", b"1"), ("b", b"2")], T) == [True, True]
        shutil.rmtree(root)                 # someone clears the cache under a running server
        stored = await store.put([("c", b"3")], T)
        return stored, await store.get(["a", "b", "c"], T)

    assert run(store, body) == ([True], [None, None, b"3"])
    assert sum(store.stats.errors.values()) == 0
    store.check_integrity()                 # the vanished entries left the index when missed


def test_integrity_holds_at_every_instant_under_concurrent_batches(tmp_path):
    """check_integrity from another thread (as the engine's checks run) while concurrent
    batches put, read, delete and evict the same keys on several pool threads."""
    store = FileStore(str(tmp_path), disk_cap=40 * SIZE, min_age=0.0, workers=4)
    keys = [f"k{i}" for i in range(60)]
    failures: list[BaseException] = []
    checks = 0
    done = threading.Event()

    def checker():
        nonlocal checks
        while not done.is_set():
            try:
                store.check_integrity()
            except BaseException as e:       # noqa: B036 - reported by the test below
                failures.append(e)
            checks += 1
            # (A check holds the index lock while it scans the directory: back to back, it
            # would starve the batches past their deadline on a busy machine.)
            time.sleep(0.002)

    async def worker(seed):
        rng = random.Random(seed)
        for _ in range(40):
            batch = rng.sample(keys, 6)
            op = rng.random()
            if op < 0.5:
                await store.put([(k, _val(rng.randrange(256))) for k in batch], T)
            elif op < 0.8:
                await store.get(batch, T)
            elif op < 0.9:
                await store.touch(batch, T)
            else:
                await store.delete(batch, T)

    async def body():
        thread = threading.Thread(target=checker)
        thread.start()
        try:
            await asyncio.gather(*(worker(s) for s in range(6)))
        finally:
            done.set()
            thread.join()

    run(store, body)
    assert failures == [] and checks > 0
    store.check_integrity()
    s = store.stats
    assert s.errors == {c: 0 for c in s.errors} and s.dropped == 0
