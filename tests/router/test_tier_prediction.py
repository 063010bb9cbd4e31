"""The router's prediction with the tiers below the tree, against real engines: two tiny
Gemma 3 engines (hybrid, window 8, page 4) with a small device cache, a host tier (L2) that
itself evicts, and one disk store (L3) that both write through. The mirrors a worker's
publisher drains (TreeMirror, TierMirror) are replayed into the sets Redis would hold: each
engine's own tree and host sets, one shared set for the store. Before every request, the
prediction `policy.tiered` computes from those sets alone must equal the `cached_tokens`
the engine then reports (L1 hits, L2 promotions and L3 loads together), and its L1 part the
tree's own `peek`; the weighted credit lies between the L1 hit and the whole one. A store
that loses entries behind everyone's back is over-credited until a lookup misses them, and
predicted exactly again after."""
from __future__ import annotations

import random

import pytest
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.engine.cache_mirror import TierMirror, TreeMirror
from mimo.kvcache.tiers.keys import FULL, SWA
from mimo.router.cache_events import L2_FULL, L2_SWA
from mimo.router.policy import prompt_pages, tiered

PAGE, W = 4, 8
GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
BASE = dict(dtype="float32", page_size=PAGE, progress=False, max_model_len=2048,
            max_num_batched_tokens=64)
L2C, L3C = 0.8, 0.5


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=7, max_position_embeddings=2048))


class Worker:
    """An engine and the sets its publisher would keep in Redis (`shared`: the store's)."""
    def __init__(self, loaded, store: str | None, shared: dict[str, set[bytes]], **kw):
        if store is not None:
            kw["kv_storage"] = f"file:{store}"
        self.llm = LLM("tiny", loaded=loaded, **BASE, **kw)
        cache = self.llm.engine.cache
        self.keys = cache.keys
        self.tree = TreeMirror(cache.tree, cache.keys)
        self.tiers = TierMirror(cache.host, cache.storage)
        self.sets = {FULL: set(), SWA: set(), L2_FULL: set(), L2_SWA: set()}
        self.shared = shared

    def publish(self) -> None:
        assert self.llm.engine.flush_tiers()
        for (kind, key), present in self.tree.drain().items():
            (self.sets[kind].add if present else self.sets[kind].discard)(key)
        for (kind, key), present in self.tiers.drain().items():
            target = self.sets if kind in (L2_FULL, L2_SWA) else self.shared
            (target[kind].add if present else target[kind].discard)(key)

    def predict(self, prompt: list[int]):
        n = prompt_pages(len(prompt), PAGE)
        keys = self.keys.page_keys(prompt[:n * PAGE])

        def has(s):
            return [k in s for k in keys]
        s, cache = self.sets, self.llm.engine.cache
        return tiered(has(s[FULL]), has(s[SWA]), W, PAGE, cache.tree.rebuild,
                      (has(s[L2_FULL]), has(s[L2_SWA])) if cache.host is not None else None,
                      (has(self.shared[FULL]), has(self.shared[SWA]))
                      if cache.storage is not None else None, L2C, L3C)

    def run(self, prompt: list[int]):
        return self.llm.generate({"prompt_token_ids": prompt}, GREEDY)[0]

    def close(self) -> None:
        self.llm.engine.close()


def _sessions(rnd: random.Random, n: int) -> list[list[int]]:
    common = [rnd.randrange(3, 512) for _ in range(24)]
    return [common + [rnd.randrange(3, 512) for _ in range(rnd.randrange(8, 40))]
            for _ in range(n)]


@pytest.mark.parametrize("seed,tiers", [(0, "l2+l3"), (1, "l2"), (2, "l3")])
def test_tiered_prediction_equals_what_the_engines_reuse(loaded, tmp_path, seed, tiers):
    rnd = random.Random(seed)
    shared: dict[str, set[bytes]] = {FULL: set(), SWA: set()}
    # A device cache of a few prompts, a host tier of a few more: both evict.
    host = {"host_kv_cache_memory": "256KiB"} if "l2" in tiers else {}
    ws = [Worker(loaded, str(tmp_path) if "l3" in tiers else None, shared,
                 kv_cache_memory="256KiB", **host) for _ in range(2)]
    try:
        convs = _sessions(rnd, 8)
        seen = {"l2": 0, "l3": 0, "split": 0}
        for step in range(48):
            i = rnd.randrange(len(convs))
            w = ws[rnd.randrange(2)]
            prompt = convs[i]
            for x in ws:
                x.publish()
            p = w.predict(prompt)
            assert p.l1 == w.llm.engine.cache.tree.peek(prompt[:-1]), step
            out = w.run(prompt)
            # (Whole pages: L1 may copy a partial page's first rows after them, which the
            # published keys do not name: kvcache/radix/tails.py.)
            assert out.cached_tokens // PAGE * PAGE == p.tokens, (step, p, out.cached_tokens)
            assert p.l1 <= p.credit <= p.tokens
            assert p.credit == p.tokens - PAGE * (p.l2_pages * (1 - L2C) + p.l3_pages * (1 - L3C))
            seen["l2"] += p.l2_pages > 0
            seen["l3"] += p.l3_pages > 0
            seen["split"] += p.tokens > p.l1 and p.l2_pages + p.l3_pages == 0
            convs[i] = prompt + list(out.token_ids) + [rnd.randrange(3, 512)
                                                      for _ in range(rnd.randrange(4, 12))]
        # The run exercised every source: host-tier and store hits (and, on some seeds,
        # split hits whose full KV stayed in the tree while the window came from below).
        assert all(seen[t] for t in tiers.split("+")), seen
        for x in ws:
            x.llm.engine.check_integrity()
    finally:
        for x in ws:
            x.close()


def test_a_store_that_lost_entries_is_learned_from_the_miss(loaded, tmp_path):
    shared: dict[str, set[bytes]] = {FULL: set(), SWA: set()}
    a = Worker(loaded, str(tmp_path), shared, kv_cache_memory="256KiB")
    # Read-only workers: what they learn is not undone by writing the prefix back.
    b, c, d = (Worker(loaded, str(tmp_path), shared, kv_cache_memory="256KiB",
                      kv_storage_write="off") for _ in range(3))
    ws = [a, b, c, d]
    try:
        rnd = random.Random(5)
        prompt = [rnd.randrange(3, 512) for _ in range(60)]
        whole = (len(prompt) - 1) // PAGE * PAGE
        a.run(prompt)
        for x in ws:
            x.publish()
        p = b.predict(prompt)
        assert (p.l1, p.tokens, p.l3_pages) == (0, whole, whole // PAGE)
        assert b.run(prompt).cached_tokens == whole
        for f in tmp_path.rglob("*"):       # the store evicts behind everyone's back
            if f.is_file():
                f.unlink()
        for x in ws:
            x.publish()
        assert c.predict(prompt).tokens == whole            # over-credited, once
        assert c.run(prompt).cached_tokens == 0
        for x in ws:
            x.publish()
        keys = a.keys.page_keys(prompt[:whole])
        assert not any(k in shared[FULL] or k in shared[SWA] for k in keys)
        p = d.predict(prompt)
        assert p.tokens == d.run(prompt).cached_tokens == 0
    finally:
        for x in ws:
            x.close()
