"""Sessions paused in a tool call keep their window: what `RadixTree.hold` marks is evicted
after speculative windows, keyless requests and finished sessions (prompt_cache_key), until
its time is up; then it ages like anything else. Orders are checked against the plain rule
written out here (least recently used, keyless before sessions before held), and every
pool's accounting (free + evictable + in use == capacity) holds after every step."""
from __future__ import annotations

import pytest
import torch
from helpers.kv_checks import insert_as_engine
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.kvcache.pool.allocator import PageAllocator
from mimo.kvcache.radix.retention import RetentionPolicy
from mimo.kvcache.radix.tree import RadixTree

P, W = 4, 8


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def tree_with_clock(policy=None, rebuild=0, pages=64):
    tree = RadixTree(P, W, PageAllocator(pages, "full"), PageAllocator(pages, "swa"),
                     policy or RetentionPolicy(keep_all=True), "hybrid", rebuild=rebuild)
    tree.clock = Clock()
    return tree


def check(tree):
    tree.check_integrity()
    for a in (tree.full_alloc, tree.swa_alloc):
        assert a.num_free + a.num_evictable + a.num_in_use == a.capacity


def seqs(n, length=16):
    return [[1000 * (i + 1) + j for j in range(length)] for i in range(n)]


def eviction_order(tree, named, **evict):
    """Evict step by step; the names of the sequences whose cached length drops, in order."""
    order = []
    while len(order) < len(named):
        tree.evict(**evict)
        check(tree)
        gone = [k for k, t in named.items() if k not in order and tree.peek(t, rebuild=0) < len(t)]
        assert len(gone) == 1, gone
        order += gone
    return order


@pytest.mark.parametrize("held", [True, False])
def test_a_paused_session_s_leaf_goes_last_until_its_time_is_up(held):
    tree = tree_with_clock()
    p, s, k = seqs(3)
    insert_as_engine(tree, p)                         # the paused one is the oldest
    if held:
        assert tree.hold(p, seconds=60.0) == len(p)
    insert_as_engine(tree, s, protect=True)           # a finished prompt_cache_key session
    insert_as_engine(tree, k)
    named = {"paused": p, "session": s, "keyless": k}
    want = ["keyless", "session", "paused"] if held else ["paused", "keyless", "session"]
    assert eviction_order(tree, named, full=4) == want


def test_after_its_time_a_paused_session_ages_from_when_it_paused():
    tree = tree_with_clock()
    p, s, k = seqs(3)
    insert_as_engine(tree, p)
    tree.hold(p, seconds=60.0)
    insert_as_engine(tree, s, protect=True)
    insert_as_engine(tree, k)
    tree.clock.t = 59.0
    tree.evict(full=0)
    assert tree.num_holds == 1
    tree.clock.t = 60.0
    assert eviction_order(tree, {"paused": p, "session": s, "keyless": k}, full=4) == \
        ["paused", "keyless", "session"]
    assert tree.num_holds == 0


def test_a_paused_session_s_window_outlives_finished_sessions_and_speculative_windows():
    # Rebuild on: leaves longer than a receptive field keep their full KV and lose only their
    # window to SWA pressure, so the windows' order is visible on its own.
    pol = RetentionPolicy(dense_every=2 * P)        # speculative windows every 8 tokens
    tree = tree_with_clock(pol, rebuild=W)
    p, s, k = seqs(3, 32)
    insert_as_engine(tree, p)
    tree.hold(p, seconds=30.0)
    insert_as_engine(tree, s, protect=True)
    insert_as_engine(tree, k)
    live = tree.swa_alloc.num_evictable
    tree.evict(swa=live - 2)                # all but the last window's worth
    check(tree)
    assert tree.peek(p, rebuild=0) == 32                 # its trailing window survived
    assert tree.peek(s, rebuild=0) < 32 and tree.peek(k, rebuild=0) < 32
    tree.clock.t = 31.0
    tree.evict(swa=1)
    check(tree)
    assert tree.peek(p, rebuild=0) < 32                  # no longer held


def test_resuming_the_session_ends_its_head_start():
    """A match on the held path is the session coming back: its nodes take the match's
    time, and when that hold expires nothing is changed back."""
    tree = tree_with_clock()
    p, k = seqs(2)
    insert_as_engine(tree, p)
    tree.hold(p, seconds=60.0)
    insert_as_engine(tree, k)
    m = tree.match(p)                       # the next turn arrives...
    tree.lock(m.node)
    tree.unlock(m.node)                     # ...and is, say, aborted before running
    tree.clock.t = 61.0
    assert eviction_order(tree, {"k": k, "p": p}, full=4) == ["k", "p"]


def test_hold_of_something_not_cached_or_zero_seconds_holds_nothing():
    tree = tree_with_clock()
    (p,) = seqs(1)
    assert tree.hold(p, seconds=60.0) == 0
    insert_as_engine(tree, p)
    assert tree.hold(p, seconds=0.0) == 0
    assert tree.hold(p[:8] + [7] * 8, seconds=60.0) == 8     # the cached part only
    check(tree)


def test_the_engine_holds_a_finished_request_and_releases_after_the_flag_s_time():
    loaded = loaded_from_hf(tiny_gemma3_hf(seed=7, max_position_embeddings=512))
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="8MiB", dtype="float32", page_size=P,
              progress=False, max_model_len=512, tool_pause_hold=5.0)
    eng = llm.engine
    tree = eng.cache.tree
    tree.clock = Clock()
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 512, (64,), generator=g).tolist() for _ in range(3)]
    done = []
    for ids in prompts:                     # the paused one is the oldest
        seq = eng.add_request(ids, greedy)
        while seq.finish_reason is None:
            eng.step()
        done.append(seq)
    assert eng.hold_paused(done[0]) >= 60
    per_prompt = eng.pool.full.allocator.num_evictable // 3
    tree.evict(full=2 * per_prompt)
    eng.check_integrity()
    assert [tree.peek(p[:-1]) for p in prompts] == [60, 0, 0]
    tree.clock.t = 5.0
    tree.evict(full=per_prompt)
    eng.check_integrity()
    assert tree.peek(prompts[0][:-1]) == 0
