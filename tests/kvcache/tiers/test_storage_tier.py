"""StorageTier lookups against a real file store: the hit a lookup returns is the longest
window-safe one the tiers hold together (a brute-force reference over what is stored), its
payloads are exactly the pages that hit needs, and a repeated prompt costs one read."""
from __future__ import annotations

import random

import pytest
import torch

from mimo.kvcache.pool.dual_pool import DualPool
from mimo.kvcache.pool.layout import KVLayout, LayerKV
from mimo.kvcache.radix.retention import window_pages
from mimo.kvcache.tiers.file_store import FileStore
from mimo.kvcache.tiers.keys import FULL, SWA, KeyChain
from mimo.kvcache.tiers.page_io import PageIO
from mimo.kvcache.tiers.storage_tier import FetchPlan, StorageTier

P, W, PAGES = 4, 6, 12


class CountingFileStore(FileStore):
    """A real file store that counts round trips: each get, exists or get-and-probe call
    made by the tier (a get-and-probe is one, however it is served)."""

    def __init__(self, path):
        super().__init__(str(path))
        self.reads = 0
        self._inner = False

    async def get_and_probe(self, get_keys, probe_keys, timeout):
        self.reads += 1
        self._inner = True
        try:
            return await super().get_and_probe(get_keys, probe_keys, timeout)
        finally:
            self._inner = False

    async def get(self, keys, timeout):
        self.reads += not self._inner
        return await super().get(keys, timeout)

    async def exists(self, keys, timeout):
        self.reads += not self._inner
        return await super().exists(keys, timeout)


@pytest.fixture
def tier(tmp_path):
    layout = KVLayout((LayerKV(1, 2, 2),), (LayerKV(2, 3, 1),), W, 4)
    pool = DualPool(layout, full_pages=4, swa_pages=4, page_size=P)
    io = {FULL: PageIO(pool.full), SWA: PageIO(pool.swa)}
    store = CountingFileStore(tmp_path / "kv")
    t = StorageTier(store, KeyChain(b"fp", P), io, W, timeout=10.0, queue_size=8)
    yield t
    t.close()


def _payload(tier, kind, i) -> bytes:
    return bytes([(i * 7 + (kind == SWA)) % 251]) * tier.io[kind].row_bytes


def _store(tier, keys, full: set[int], swa: set[int]) -> None:
    for kind, pages in ((FULL, sorted(full)), (SWA, sorted(swa))):
        if not pages:
            continue
        blob = b"".join(_payload(tier, kind, i) for i in pages)
        rows = torch.frombuffer(bytearray(blob), dtype=torch.float32).reshape(len(pages), -1)
        assert tier.write([tier.keys.name(kind, keys[i]) for i in pages], rows)
    assert tier.flush(10)
    assert not tier.failed_keys()


def _reference(full_ok, swa_ok, floor) -> int:
    """The longest n > floor with full [0, n) and the SWA window before n * P present."""
    best = floor
    for n in range(1, len(full_ok) + 1):
        if all(full_ok[:n]) and all(swa_ok[i] for i in window_pages(n * P, W, P)):
            best = max(best, n)
    return best


def _lookup(tier, keys, local_f, local_s):
    from mimo.kvcache.tiers.hit_plan import best_hit
    floor = best_hit(local_f, local_s, W, P)
    return floor, tier.fetch(FetchPlan(keys, local_f, local_s, floor)).result(10)


def test_a_repeated_prompt_loads_in_one_read(tier):
    keys = tier.keys.page_keys(list(range(PAGES * P)))
    _store(tier, keys, set(range(PAGES)), set(window_pages(PAGES * P, W, P)) | {1, 2})
    tier.storage.reads = 0
    _, res = _lookup(tier, keys, [False] * PAGES, [False] * PAGES)
    assert res.pages == PAGES
    assert tier.storage.reads == 1
    want = {(FULL, keys[i]) for i in range(PAGES)}
    want |= {(SWA, keys[i]) for i in window_pages(PAGES * P, W, P)}
    assert set(res.payloads) == want


def test_a_shorter_window_safe_hit_reads_its_own_window(tier):
    keys = tier.keys.page_keys(list(range(PAGES * P)))
    n = 7                                       # the only window kept ends at page 7
    _store(tier, keys, set(range(PAGES)), set(window_pages(n * P, W, P)))
    tier.storage.reads = 0
    _, res = _lookup(tier, keys, [False] * PAGES, [False] * PAGES)
    assert res.pages == n
    assert tier.storage.reads == 2
    want = {(FULL, keys[i]) for i in range(n)} | {(SWA, keys[i]) for i in window_pages(n * P, W, P)}
    assert set(res.payloads) == want
    for (kind, key), blob in res.payloads.items():
        assert blob == _payload(tier, kind, keys.index(key))


@pytest.mark.parametrize("seed", range(40))
def test_random_splits_match_the_brute_force_hit(tier, seed):
    rng = random.Random(seed)
    keys = tier.keys.page_keys([seed] + list(range(PAGES * P - 1)))
    full = {i for i in range(PAGES) if rng.random() < 0.85}
    swa = {i for i in range(PAGES) if rng.random() < 0.5}
    _store(tier, keys, full, swa)
    local_f = [rng.random() < 0.3 for _ in range(PAGES)]
    local_s = [rng.random() < 0.3 for _ in range(PAGES)]
    floor, res = _lookup(tier, keys, local_f, local_s)
    full_ok = [local_f[i] or i in full for i in range(PAGES)]
    swa_ok = [local_s[i] or i in swa for i in range(PAGES)]
    n = _reference(full_ok, swa_ok, floor)
    if n <= floor:
        assert res.pages == 0 and not res.payloads
        return
    assert res.pages == n
    want = {(FULL, keys[i]) for i in range(n) if not local_f[i]}
    want |= {(SWA, keys[i]) for i in window_pages(n * P, W, P) if not local_s[i]}
    assert set(res.payloads) == want
    for (kind, key), blob in res.payloads.items():
        assert blob == _payload(tier, kind, keys.index(key))
