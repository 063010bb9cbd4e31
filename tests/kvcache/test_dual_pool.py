"""DualPool: page movement between sequences and the two pools, and the full->SWA map."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.kv_checks import check_map, live_swa_pages
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mimo.config import ModelConfig
from mimo.kvcache.pool.allocator import OutOfPages
from mimo.kvcache.pool.dual_pool import DualPool
from mimo.kvcache.pool.layout import (
    KVLayout,
    LayerKV,
    shape_layout,
    swa_steady_pages,
    swa_transient_pages,
)


def tiny_layout(window: int = 6, hybrid: bool = True) -> KVLayout:
    full = (LayerKV(1, 2, 2),)
    swa = (LayerKV(2, 3, 1), LayerKV(2, 3, 1))
    if not hybrid:
        return KVLayout(full + swa, (), window, 4, hybrid=False)
    return KVLayout(full, swa, window, 4)


def tiny_model_config() -> ModelConfig:
    return ModelConfig(arch="t", vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=3,
                       num_heads=2, layer_types=("swa", "swa", "full"), full_kv_heads=1,
                       swa_kv_heads=2, head_dim=4, v_head_dim=4, swa_head_dim=4,
                       swa_v_head_dim=4, sliding_window=4, rope_theta=1e4, rope_local_theta=1e4)


def test_pool_tensors_allocated_with_each_layers_shape():
    dp = DualPool(tiny_layout(), full_pages=5, swa_pages=3, page_size=4)
    assert dp.full.k(0).shape == (20, 1, 2) and dp.full.v(0).shape == (20, 1, 2)
    assert dp.swa.k(1).shape == (12, 2, 3) and dp.swa.v(1).shape == (12, 2, 1)
    assert dp.full_to_swa.shape == (20,) and bool((dp.full_to_swa == -1).all())
    # allocate=False: same bookkeeping, no tensors and no map (sizing of huge models).
    nb = DualPool(tiny_layout(), full_pages=5, swa_pages=3, page_size=4, allocate=False)
    assert nb.full_to_swa is None and nb.swa.allocator.capacity == 3
    with pytest.raises(RuntimeError, match="bookkeeping only"):
        nb.full.k(0)


@pytest.mark.parametrize("allocate", [True, False])
def test_grow_release_free_walkthrough(allocate):
    W, P = 6, 4
    dp = DualPool(tiny_layout(W), full_pages=8, swa_pages=6, page_size=P, allocate=allocate)
    s = dp.new_seq()
    assert dp.pages_to_grow(s, 10) == (3, 3)
    dp.grow(s, 10)                       # positions [0, 10): pages 0..2
    assert len(s.full_pages) == 3 and live_swa_pages(s) == 3
    dp.check_integrity()
    check_map(dp, [s])
    dp.grow(s, 12)                       # still inside page 2: nothing to allocate
    assert len(s.full_pages) == 3
    # Next query at 12 sees (6, 12]: page 0 ([0, 4)) and page 1 ([4, 8)) hold 7 -> keep page 1.
    assert dp.release_window(s, 12) == 1
    assert s.swa_pages[0] is None and s.swa_released == 1
    assert dp.release_window(s, 12) == 0        # idempotent
    assert dp.release_window(s, 5) == 0         # going back releases nothing, undoes nothing
    dp.check_integrity()
    check_map(dp, [s])
    with pytest.raises(RuntimeError):
        dp.swa_slots(s, 3, 5)                  # position 3 was released
    slots = dp.swa_slots(s, 7, 12)
    assert slots.tolist() == [s.swa_pages[p // P] * P + p % P for p in range(7, 12)]
    if allocate:
        assert torch.equal(dp.full_to_swa[dp.full_slots(s, 7, 12)], slots)
        assert bool((dp.full_to_swa[dp.full_slots(s, 0, 4)] == -1).all())
    assert dp.stats()["swa"]["in_use"] == 2 and dp.stats()["full"]["in_use"] == 3
    dp.free_seq(s)
    assert dp.stats()["full"]["in_use"] == 0 and dp.stats()["swa"]["in_use"] == 0
    assert dp.num_live_seqs == 0
    dp.check_integrity()
    with pytest.raises(RuntimeError):
        dp.free_seq(s)                       # second free of the same sequence
    dp.check_integrity()


def test_grow_is_all_or_nothing_when_one_pool_is_short():
    dp = DualPool(tiny_layout(), full_pages=10, swa_pages=2, page_size=4)
    s = dp.new_seq()
    dp.grow(s, 4)
    before = (dp.stats(), list(s.full_pages), list(s.swa_pages), dp.full_to_swa.clone())
    assert dp.pages_to_grow(s, 16) == (3, 3) and dp.swa.allocator.num_free == 1
    with pytest.raises(OutOfPages):
        dp.grow(s, 16)                       # 3 more of each; the SWA pool has 1 free
    assert before[:3] == (dp.stats(), s.full_pages, s.swa_pages)
    assert torch.equal(before[3], dp.full_to_swa)
    assert dp.pages_to_grow(s, 8) == (1, 1)
    dp.check_integrity()


def test_foreign_sequence_cannot_be_freed():
    a = DualPool(tiny_layout(), 4, 4, 4)
    b = DualPool(tiny_layout(), 4, 4, 4)
    s = a.new_seq()
    a.grow(s, 5)
    with pytest.raises(RuntimeError):
        b.free_seq(s)
    a.free_seq(s)
    a.check_integrity()


def test_leaked_sequences_are_counted():
    # A sequence dropped without free_seq (a leak) must stay counted: were only id(seq) kept,
    # CPython could reuse the id for the next new_seq and the leak would go unseen.
    dp = DualPool(tiny_layout(), 20, 20, 4)
    for _ in range(5):
        s = dp.new_seq()      # rebinding drops the previous, unfreed sequence
        dp.grow(s, 4)
    del s
    assert dp.full.allocator.num_in_use == 5
    assert dp.num_live_seqs == 5
    dp.check_integrity()


def _steady(W, P, L):
    """Written out independently of layout.py: SWA pages a request of L tokens holds after
    release_window(L): at most the pages of positions (L - W, L], one more for misalignment."""
    return min(math.ceil(L / P), math.ceil(W / P) + 1)


def _transient(chunk, P):
    return math.ceil(chunk / P) + 1 if chunk else 0


def test_swa_steady_and_transient_pages_hand_values():
    assert swa_steady_pages(6, 4, 1000) == 3 and swa_steady_pages(6, 4, 5) == 2
    assert swa_steady_pages(128, 16, 32768) == 9 and swa_steady_pages(512, 16, 8192) == 33
    assert swa_steady_pages(128, 16, 100) == 7 and swa_steady_pages(128, 16, 1) == 1
    assert swa_transient_pages(8, 4) == 3 and swa_transient_pages(2048, 16) == 129
    assert swa_transient_pages(1, 16) == 2 and swa_transient_pages(0, 16) == 0


@pytest.mark.parametrize("W,P,chunk", [(6, 4, 8), (6, 4, 3), (5, 4, 7), (1, 1, 1), (1, 4, 4),
                                       (16, 16, 16), (20, 8, 1), (128, 16, 512),
                                       (128, 16, 2048), (512, 16, 100), (13, 2, 9)])
def test_swa_page_bounds_hold_for_engine_pattern(W, P, chunk):
    """Prefill in chunks with a release after each, then decode: after each release a request
    holds at most swa_steady_pages; between a grow and its release at most steady + transient."""
    for context in (1, P, P + 1, W, W + 1, W + P, 3 * W + 2 * chunk + 5):
        assert swa_steady_pages(W, P, context) == _steady(W, P, context)
        assert swa_transient_pages(chunk, P) == _transient(chunk, P)
        dp = DualPool(tiny_layout(W), 10_000, 10_000, P, allocate=False)
        s, n, peak_steady = dp.new_seq(), 0, 0
        while n < context + 3 * P:          # prefill by chunks, then decode token by token
            n = min(n + chunk, context) if n < context else n + 1
            dp.grow(s, n)
            # Mid-step: what the request held before plus this chunk's new pages.
            assert live_swa_pages(s) <= swa_steady_pages(W, P, n) + swa_transient_pages(chunk, P)
            dp.release_window(s, n)
            assert live_swa_pages(s) <= swa_steady_pages(W, P, n)
            peak_steady = max(peak_steady, live_swa_pages(s))
            if n <= context:                # the planning length bounds the prompt's steps
                assert live_swa_pages(s) <= swa_steady_pages(W, P, context)
        if W % P == 0 and W > 1:
            # Tight: with the window on page boundaries some length holds exactly the bound.
            assert peak_steady == _steady(W, P, n)
        dp.free_seq(s)
        dp.check_integrity()


@pytest.mark.parametrize("make", [
    lambda: shape_layout("gemma-3-270m", layout="full-kv"),
    lambda: shape_layout("mimo-v2-flash", layout="full-kv"),
    lambda: KVLayout.from_model(tiny_model_config(), "float32", layout="full-kv"),
    lambda: tiny_layout(hybrid=False),
])
@pytest.mark.parametrize("allocate", [True, False])
def test_full_kv_layout_has_no_swa_pool(make, allocate):
    lay = make()
    dp = DualPool(lay, full_pages=6, swa_pages=5, page_size=4, allocate=allocate)
    assert not dp.hybrid and dp.swa.allocator.capacity == 0 and dp.full_to_swa is None
    s = dp.new_seq()
    assert dp.pages_to_grow(s, 20) == (5, 0)
    dp.grow(s, 20)
    assert dp.release_window(s, 20) == 0     # every layer keeps all its KV
    assert s.swa_pages == [] and live_swa_pages(s) == 0
    assert torch.equal(dp.swa_slots(s, 0, 20), dp.full_slots(s, 0, 20))
    with pytest.raises(OutOfPages):
        dp.grow(s, 28)
    dp.check_integrity()
    dp.free_seq(s)
    assert dp.stats()["full"] == {"capacity": 6, "free": 6, "evictable": 0, "in_use": 0}
    dp.check_integrity()


# ---- random driving against a brute-force model ------------------------------------------

class SeqModel:
    def __init__(self, seq):
        self.seq = seq
        self.len = 0           # tokens written
        self.released_at = 0   # largest seq_len release_window was called with
        self.pending = 0       # tokens grown since the last release


class DualPoolMachine(RuleBasedStateMachine):
    """Several sequences through random grow-by-chunk / release / free steps, the engine's
    pattern (release after each grow) among them."""

    @initialize(window=st.integers(1, 20), page=st.sampled_from([1, 2, 4, 8]),
                full_pages=st.integers(1, 40), swa_pages=st.integers(1, 30),
                max_chunk=st.integers(1, 24), allocate=st.booleans())
    def setup(self, window, page, full_pages, swa_pages, max_chunk, allocate):
        self.W, self.P, self.max_chunk = window, page, max_chunk
        self.dp = DualPool(tiny_layout(window), full_pages, swa_pages, page, allocate=allocate)
        self.seqs: list[SeqModel] = []

    def _pages_needed(self, m: SeqModel, new_len: int) -> int:
        return max(0, math.ceil(new_len / self.P) - len(m.seq.full_pages))

    @rule()
    def new_seq(self):
        if len(self.seqs) < 5:
            self.seqs.append(SeqModel(self.dp.new_seq()))

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4), chunk=st.integers(1, 24), release=st.booleans())
    def grow(self, i, chunk, release):
        m = self.seqs[i % len(self.seqs)]
        chunk = min(chunk, self.max_chunk)
        new_len = m.len + chunk
        need = self._pages_needed(m, new_len)
        fits = (need <= self.dp.full.allocator.num_free
                and need <= self.dp.swa.allocator.num_free)
        before = (self.dp.stats(), list(m.seq.full_pages), list(m.seq.swa_pages))
        if not fits:
            with pytest.raises(OutOfPages):
                self.dp.grow(m.seq, new_len)
            assert before == (self.dp.stats(), m.seq.full_pages, m.seq.swa_pages)
            return
        self.dp.grow(m.seq, new_len)
        assert len(m.seq.full_pages) == len(before[1]) + need
        m.len, m.pending = new_len, m.pending + chunk
        if release:
            self._release(m)

    def _release(self, m: SeqModel):
        # Brute force: a page goes once its last position is older than the next query's window.
        cut = max(0, m.len - self.W + 1)
        expect = [p for p in range(len(m.seq.full_pages))
                  if (p + 1) * self.P <= cut and m.seq.swa_pages[p] is not None]
        assert self.dp.release_window(m.seq, m.len) == len(expect)
        m.released_at, m.pending = m.len, 0

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4))
    def release(self, i):
        self._release(self.seqs[i % len(self.seqs)])

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4))
    def free(self, i):
        m = self.seqs.pop(i % len(self.seqs))
        self.dp.free_seq(m.seq)
        with pytest.raises(RuntimeError):
            self.dp.free_seq(m.seq)

    @invariant()
    def consistent(self):
        if not hasattr(self, "dp"):
            return
        dp, P, W = self.dp, self.P, self.W
        dp.check_integrity()
        check_map(dp, [m.seq for m in self.seqs])
        assert dp.full.allocator.num_in_use == sum(len(m.seq.full_pages) for m in self.seqs)
        assert dp.swa.allocator.num_in_use == sum(live_swa_pages(m.seq) for m in self.seqs)
        assert dp.num_live_seqs == len(self.seqs)
        held_full = [p for m in self.seqs for p in m.seq.full_pages]
        held_swa = [p for m in self.seqs for p in m.seq.swa_pages if p is not None]
        assert len(set(held_full)) == len(held_full) and len(set(held_swa)) == len(held_swa)
        for m in self.seqs:
            s = m.seq
            assert len(s.full_pages) == math.ceil(m.len / P) == len(s.swa_pages)
            cut = max(0, m.released_at - W + 1)
            for p, sp in enumerate(s.swa_pages):
                assert (sp is None) == ((p + 1) * P <= cut), (p, cut)
            # The next query (at m.len) must find its whole window live.
            lo, hi = max(0, m.len - W + 1), min(m.len + 1, len(s.full_pages) * P)
            if lo < hi:
                slots = dp.swa_slots(s, lo, hi)
                if dp.full_to_swa is not None:
                    assert torch.equal(dp.full_to_swa[dp.full_slots(s, lo, hi)], slots)
            if cut >= P:
                with pytest.raises(RuntimeError):
                    dp.swa_slots(s, 0, 1)
            # Window + what was grown since the last release + one page; with a release after
            # every grow (the engine's pattern) pending <= max_chunk.
            assert live_swa_pages(s) <= math.ceil((W + m.pending) / P) + 1
            if m.pending <= self.max_chunk:
                assert live_swa_pages(s) <= math.ceil((W + self.max_chunk) / P) + 1

    def teardown(self):
        if hasattr(self, "dp"):
            for m in self.seqs:
                self.dp.free_seq(m.seq)
            self.dp.check_integrity()
            assert self.dp.full.allocator.num_free == self.dp.full.allocator.capacity
            assert self.dp.swa.allocator.num_free == self.dp.swa.allocator.capacity


TestDualPoolMachine = DualPoolMachine.TestCase
TestDualPoolMachine.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)


def test_long_request_swa_stays_bounded():
    """One long request in the engine's pattern: SWA held stays O(window), full grows O(N)."""
    W, P, chunk = 128, 16, 512
    dp = DualPool(shape_layout("mimo-v2-flash"), 1000, 60, P, allocate=False)
    s, n, peak = dp.new_seq(), 0, 0
    while n < 10_000:
        n = min(n + chunk, 10_000)
        dp.grow(s, n)
        peak = max(peak, live_swa_pages(s))
        dp.release_window(s, n)
    for _ in range(40):                     # decode
        n += 1
        dp.grow(s, n)
        dp.release_window(s, n)
    assert peak <= math.ceil((W + chunk) / P) + 1
    assert live_swa_pages(s) <= math.ceil((W + P) / P)
    assert len(s.full_pages) == math.ceil(n / P)
    dp.check_integrity()
