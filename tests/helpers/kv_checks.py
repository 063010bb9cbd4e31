"""Checks on DualPool state shared by the kvcache and engine tests, and a radix tree
insert the way the engine does one (match, lock, insert, free the duplicates, unlock)."""
from __future__ import annotations

import torch

from mimo.kvcache.pool.dual_pool import DualPool
from mimo.kvcache.pool.seq_kv import SeqKV


def live_swa_pages(kv: SeqKV) -> int:
    """SWA pages the request still holds (not released)."""
    return sum(p is not None for p in kv.swa_pages)


def check_map(dp: DualPool, seqs) -> None:
    """full_to_swa must agree with every live sequence's page tables, and be -1 elsewhere."""
    if dp.full_to_swa is None:
        return
    P = dp.page_size
    ar = torch.arange(P)
    expected = torch.full_like(dp.full_to_swa, -1)
    for seq in seqs:
        for p, fpage in enumerate(seq.full_pages):
            sp = seq.swa_pages[p]
            if sp is not None:
                expected[fpage * P:(fpage + 1) * P] = sp * P + ar
    assert torch.equal(dp.full_to_swa, expected)


def insert_as_engine(tree, toks, protect=False) -> None:
    """Match `toks`, lock the match, insert the whole pages with fresh pages for all of
    them (the tree keeps what it lacks, the rest comes back as duplicates to free), unlock;
    then check the tree and that every pool accounts for each page exactly once."""
    fa, sa = tree.full_alloc, tree.swa_alloc
    m = tree.match(toks)
    tree.lock(m.node)
    n = len(toks) // tree.P
    res = tree.insert(toks, fa.alloc(n), sa.alloc(n), prompt_len=len(toks), protect=protect)
    fa.free(res.dup_full)
    sa.free(res.dup_swa)
    tree.unlock(m.node)
    tree.check_integrity()
    for a in (fa, sa):
        assert a.num_free + a.num_evictable + a.num_in_use == a.capacity


def drop_speculative_windows(llm) -> None:
    """Free, as SWA pressure would first, the SWA of the cache's nodes that hold no firm
    window (a prefill's chunks and the dense grid leave those: radix/retention.py)."""
    eng, tree = llm.engine, llm.engine.cache.tree
    spare = [n for n in tree.paths.nodes() if n.swa and n.swa_time < 0 and n.lock_ref == 0]
    assert spare, "no speculative windows to drop"
    live = sum(s >= 0 for n in spare for s in n.swa)
    eng.cache.make_room(0, eng.pool.swa.allocator.num_free + live)
    eng.check_integrity()
    assert all(s < 0 for n in spare for s in n.swa)
