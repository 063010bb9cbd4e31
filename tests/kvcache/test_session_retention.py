"""prompt_cache_key sessions are evicted last: what a request with a key leaves in the radix
tree goes after every keyless request's leaves and windows, whatever their ages; among
sessions (and among keyless ones) the order stays least-recently-used. A control run
without the hint shows the same scenario evicting the session first."""
from __future__ import annotations

import pytest
import torch
from helpers.kv_checks import insert_as_engine
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.kvcache.pool.allocator import PageAllocator
from mimo.kvcache.radix.namespace import CacheScope
from mimo.kvcache.radix.retention import RetentionPolicy
from mimo.kvcache.radix.tree import RadixTree

P, W = 4, 8


def cached(tree, toks) -> int:
    return tree.peek(toks)     # (a match would touch the nodes)


@pytest.mark.parametrize("hint", [True, False])
def test_session_leaves_go_after_keyless_ones(hint):
    tree = RadixTree(P, W, PageAllocator(64, "full"), PageAllocator(64, "swa"),
                     RetentionPolicy(keep_all=True), "hybrid")
    s1, k1, s2, k2 = ([base + i for i in range(16)] for base in (0, 1000, 2000, 3000))
    for toks, session in ((s1, True), (k1, False), (s2, True), (k2, False)):   # oldest first
        insert_as_engine(tree, toks, protect=hint and session)
    order = []
    for _ in range(4):
        tree.evict(full=4)
        tree.check_integrity()
        gone = [name for name, t in (("s1", s1), ("k1", k1), ("s2", s2), ("k2", k2))
                if name not in order and cached(tree, t) == 0]
        assert len(gone) == 1, gone
        order += gone
    assert order == (["k1", "k2", "s1", "s2"] if hint else ["s1", "k1", "s2", "k2"])


@pytest.mark.parametrize("hint", [True, False])
def test_session_windows_go_after_keyless_ones_under_swa_pressure(hint):
    # SWA wanted: the session's tail outlives a younger keyless one's.
    tree = RadixTree(P, W, PageAllocator(64, "full"), PageAllocator(64, "swa"),
                     RetentionPolicy(keep_all=True), "hybrid", rebuild=8)
    s, k = [i for i in range(32)], [1000 + i for i in range(32)]
    insert_as_engine(tree, s, protect=hint)
    insert_as_engine(tree, k, protect=False)
    tree.evict(swa=1)
    tree.check_integrity()
    kept = tree.peek(s, rebuild=0), tree.peek(k, rebuild=0)
    older_kept = kept[0] == 32 and kept[1] < 32
    assert older_kept if hint else (kept[1] == 32 and kept[0] < 32), kept


def test_the_engine_marks_a_keyed_request_s_cache_as_a_session():
    loaded = loaded_from_hf(tiny_gemma3_hf(seed=7, max_position_embeddings=512))
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="8MiB", dtype="float32", page_size=P,
              progress=False, max_model_len=512)
    eng = llm.engine
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 512, (64,), generator=g).tolist() for _ in range(3)]
    for ids, key in zip(prompts, ("task-1", None, None)):      # the session is the oldest
        seq = eng.add_request(ids, greedy, scope=CacheScope(session=key))
        while seq.finish_reason is None:
            eng.step()
    tree = eng.cache.tree
    assert [tree.peek(p[:-1]) for p in prompts] == [60] * 3
    per_prompt = eng.pool.full.allocator.num_evictable // 3
    tree.evict(full=2 * per_prompt)
    eng.check_integrity()
    assert [tree.peek(p[:-1]) for p in prompts] == [60, 0, 0]
