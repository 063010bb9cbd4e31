"""Checks on DualPool state shared by the kvcache and engine tests."""
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
