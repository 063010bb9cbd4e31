"""Paged-attention metadata (mimo/gpu/paged_metadata.py) against the torch backend.

An independent paged-attention reference written here reads only the metadata (page ids in a
kind's pool, indptrs, start positions, floor, window) and the pool tensors viewed as pages; it
must give the torch backend's output (through the runner's AttnBatch building) and write the
same slots, on real DualPool allocations (grow, release_window, truncate) with scattered pages:
prefill, decode, mixed, window rebuild and verify chunks, hand-built (exact index arrays) and
random (fixed seeds); and end to end through a tiny MiMo-V2-Flash forward (SWA sinks on).
"""
from __future__ import annotations

import random

import pytest
import torch

from mimo import SamplingParams
from mimo.engine.runner import ModelRunner
from mimo.engine.scheduler import ScheduledChunk
from mimo.engine.sequence import Sequence
from mimo.gpu.attention import AttentionBackend, TorchAttention
from mimo.gpu.paged_metadata import build_paged_metadata
from mimo.kvcache.pool.allocator import IN_USE
from mimo.kvcache.pool.dual_pool import DualPool
from mimo.kvcache.pool.layout import KVLayout, LayerKV
from mimo.models.context import ForwardContext

P, W, HQ = 4, 6, 4
FULL, SWA = LayerKV(1, 8, 8), LayerKV(2, 8, 6)      # per-kind heads and dims, as MiMo's differ


def make_pool(full_pages=16, swa_pages=12, hybrid=True, seed=0) -> DualPool:
    layout = (KVLayout((FULL,), (SWA,), W, 4) if hybrid
              else KVLayout((FULL, SWA), (), W, 4, hybrid=False))
    pool = DualPool(layout, full_pages, swa_pages, P)
    g = torch.Generator().manual_seed(seed)
    for p in (pool.full, pool.swa):     # stale values everywhere: reading a wrong slot shows
        for t in p.tensors.k + p.tensors.v:
            t.copy_(torch.randn(t.shape, generator=g))
    return pool


def new_seq(pool, i, length=128, seed=0) -> Sequence:
    ids = torch.randint(3, 300, (length,), generator=torch.Generator().manual_seed(seed + i))
    s = Sequence(i, ids.tolist(), SamplingParams(max_tokens=1), frozenset())
    s.kv = pool.new_seq()
    return s


def chunk(pool, seq, n, draft=()) -> ScheduledChunk:
    """As Scheduler._chunk: grow the pages first."""
    pool.grow(seq.kv, seq.num_computed + n)
    return ScheduledChunk(seq, seq.num_computed, n, True, list(draft))


def commit(pool, c: ScheduledChunk, kept=None) -> None:
    """As Scheduler.commit: advance, roll rejected drafts back, release the window."""
    c.seq.num_computed = c.start + (c.n if kept is None else kept)
    if kept is not None and kept < c.n:
        pool.truncate(c.seq.kv, c.seq.num_computed)
    pool.release_window(c.seq.kv, c.seq.num_computed)


def rebuild_seq(pool, i, donor, floor, cached_to) -> Sequence:
    """What PrefixCache.admit gives a window rebuild: the donor's full pages up to
    `cached_to`, no SWA below `floor` (its first computed position)."""
    s = new_seq(pool, i)
    kv = s.kv
    kv.full_pages = list(donor.kv.full_pages[:-(-cached_to // P)])
    if pool.hybrid:
        kv.swa_pages = [None] * (floor // P)
        kv.swa_released = floor // P
    kv.full_cached_to, kv.swa_floor = cached_to, floor
    s.num_computed = floor
    return s


# ---- the independent reference --------------------------------------------------------------
def paged_reference(meta, q, k, v, k_cache, v_cache, scale, sinks=None):
    """Write new K/V at (write_rows -> write_slots), then per entry: gather its pages, mask by
    absolute positions (causal, window, floor), softmax in float64 (sink logit joins it)."""
    assert meta.has_sinks == (sinks is not None), "sink flag disagrees with the layer"
    wr = meta.write_rows.long()
    k_cache.index_copy_(0, meta.write_slots.long(), k[wr])
    v_cache.index_copy_(0, meta.write_slots.long(), v[wr])
    kp = k_cache.view(-1, meta.page_size, *k_cache.shape[1:])
    vp = v_cache.view(-1, meta.page_size, *v_cache.shape[1:])
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    kv_len = meta.kv_len
    for e in range(meta.num_entries):
        r0, r1 = int(meta.qo_indptr[e]), int(meta.qo_indptr[e + 1])
        pages = meta.kv_indices[int(meta.kv_indptr[e]):int(meta.kv_indptr[e + 1])].long()
        L = int(kv_len[e])
        K = kp[pages].reshape(-1, *k_cache.shape[1:])[:L].double()
        V = vp[pages].reshape(-1, *v_cache.shape[1:])[:L].double()
        kpos = int(meta.kv_start_pos[e]) + torch.arange(L)
        qpos = int(meta.q_start_pos[e]) + torch.arange(r1 - r0)
        assert torch.equal(meta.positions[r0:r1].long(), qpos)
        assert int(qpos[-1]) == int(kpos[-1]), "key range must end at the last query"
        m = (kpos[None] <= qpos[:, None]) & (kpos[None] >= int(meta.key_floor[e]))
        if meta.window_left >= 0:
            m &= qpos[:, None] - kpos[None] <= meta.window_left
        rep = q.shape[1] // K.shape[1]
        K, V = K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1)
        s = torch.einsum("qhd,khd->hqk", q[r0:r1].double(), K) * scale
        s = s.masked_fill(~m[None], float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.double().view(-1, 1, 1).expand(-1, r1 - r0, 1)], -1)
        p = torch.softmax(s, -1)[..., :L]
        out[r0:r1] = torch.einsum("hqk,khd->qhd", p, V)
    return out.to(q.dtype)


class PagedReferenceBackend(AttentionBackend):
    """Runs a real model's layers on the metadata instead of AttnBatch."""

    def forward(self, q, k, v, k_cache, v_cache, batch, scale, sinks=None):
        return paged_reference(batch, q, k, v, k_cache, v_cache, scale, sinks)


def check_invariants(metas, chunks, pool):
    for kind, m in metas.items():
        E = m.num_entries
        qo_len = m.qo_indptr[1:] - m.qo_indptr[:-1]
        assert m.qo_indptr[0] == 0 and m.kv_indptr[0] == 0
        assert int(m.qo_indptr[-1]) == sum(c.n for c in chunks) == m.positions.numel()
        assert int(m.kv_indptr[-1]) == m.kv_indices.numel()
        assert all(t.dtype == torch.int32 for t in (m.qo_indptr, m.kv_indptr, m.kv_indices,
                                                    m.kv_last_page_len, m.kv_start_pos))
        assert bool(((m.kv_last_page_len >= 1) & (m.kv_last_page_len <= P)).all())
        assert bool((m.kv_start_pos % P == 0).all())
        assert torch.equal(m.kv_len, m.q_start_pos + qo_len - m.kv_start_pos)
        assert bool((m.key_floor <= m.q_start_pos).all())
        own = pool.swa if kind == "swa" and pool.hybrid else pool.full
        assert bool((own.allocator._state[m.kv_indices.long().numpy()] == IN_USE).all()), \
            "a page in the range is not held"
        assert m.all_decode == bool((qo_len == 1).all()) and E >= len(chunks)
        if kind == "swa":   # the range starts at the page of the first key anyone needs
            reach = torch.clamp(m.q_start_pos - m.window_left, min=0)
            first = torch.maximum(reach, m.key_floor)
            assert torch.equal(m.kv_start_pos, first - first % P)


def check_step(pool, chunks, sinks=True, split=True, seed=0):
    """Both kinds: reference on the metadata == TorchAttention on the runner's AttnBatch,
    outputs and caches written."""
    runner = ModelRunner(torch.nn.Linear(1, 1), pool, ("full", "swa"), W)
    _, _, ctx, _, _ = runner.prepare(chunks, all_logits=True)
    metas = build_paged_metadata(chunks, pool, W, swa_sinks=sinks, split_verify=split)
    check_invariants(metas, chunks, pool)
    T = sum(c.n for c in chunks)
    g = torch.Generator().manual_seed(seed)
    for kind, (kc, vc) in zip(("full", "swa"), runner.kv):
        batch, meta = ctx.batches[kind], metas[kind]
        assert torch.equal(meta.write_slots.long(), batch.write_slots)
        hkv, d, dv = kc.shape[1], kc.shape[2], vc.shape[2]
        q, k, v = (torch.randn(T, h, x, generator=g) for h, x in ((HQ, d), (hkv, d), (hkv, dv)))
        sk = torch.randn(HQ, generator=g) * 2 if kind == "swa" and sinks else None
        ka, va, kb, vb = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        want = TorchAttention().forward(q, k, v, ka, va, batch, d ** -0.5, sk)
        got = paged_reference(meta, q, k, v, kb, vb, d ** -0.5, sk)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    return metas


def ints(t):
    return t.tolist()


# ---- hand-built cases: exact arrays --------------------------------------------------------
def test_verify_and_prefill_exact_arrays():
    pool = make_pool(full_pages=8, swa_pages=8)
    a, b = new_seq(pool, 0), new_seq(pool, 1)
    commit(pool, chunk(pool, a, 12))    # full [2, 1, 0], SWA [2, 1, 0]; SWA page 0 released
    assert a.kv.swa_pages == [None, 1, 0]
    cb = chunk(pool, b, 5)              # full [4, 3]; SWA [3, 2] (2 came back from A)
    ca = chunk(pool, a, 3, draft=[7, 8])    # verify 12..14: full page 5, SWA page 4
    assert (a.kv.full_pages, a.kv.swa_pages, b.kv.full_pages, b.kv.swa_pages) == \
        ([2, 1, 0, 5], [None, 1, 0, 4], [4, 3], [3, 2])
    m = check_step(pool, [ca, cb])
    f, s = m["full"], m["swa"]
    # verify rows are one-query entries, as the runner batches them with the decodes
    assert ints(f.qo_indptr) == [0, 1, 2, 3, 8] and ints(f.entry_chunk) == [0, 0, 0, 1]
    assert ints(f.kv_indptr) == [0, 4, 8, 12, 14]
    assert ints(f.kv_indices) == [2, 1, 0, 5] * 3 + [4, 3]
    assert ints(f.kv_last_page_len) == [1, 2, 3, 1] and ints(f.kv_start_pos) == [0] * 4
    assert ints(f.q_start_pos) == [12, 13, 14, 0] and ints(f.key_floor) == [0] * 4
    assert ints(f.positions) == [12, 13, 14, 0, 1, 2, 3, 4]
    assert ints(f.write_rows) == list(range(8))
    assert ints(f.write_slots) == [20, 21, 22, 16, 17, 18, 19, 12]
    assert f.window_left == -1 and not f.has_sinks and not f.all_decode
    # SWA: query 12 sees 7..12 (pages 1..3 -> SWA 1, 0, 4); 13 and 14 no longer need page 1
    assert ints(s.kv_indptr) == [0, 3, 5, 7, 9]
    assert ints(s.kv_indices) == [1, 0, 4, 0, 4, 0, 4, 3, 2]
    assert ints(s.kv_start_pos) == [4, 8, 8, 0] and ints(s.kv_last_page_len) == [1, 2, 3, 1]
    assert ints(s.write_slots) == [16, 17, 18, 12, 13, 14, 15, 8]
    assert s.window_left == W - 1 and s.has_sinks and not s.needs_floor_mask
    # one causal entry instead
    m = check_step(pool, [ca, cb], split=False)
    assert ints(m["swa"].qo_indptr) == [0, 3, 8] and ints(m["swa"].kv_indices) == [1, 0, 4, 3, 2]
    assert ints(m["swa"].kv_last_page_len) == [3, 1] and ints(m["swa"].kv_start_pos) == [4, 0]


def test_window_rebuild_exact_arrays():
    pool = make_pool(full_pages=8, swa_pages=8)
    donor = new_seq(pool, 0)
    commit(pool, chunk(pool, donor, 16))    # full [3, 2, 1, 0]; SWA pages 3, 2 released
    r = rebuild_seq(pool, 1, donor, floor=8, cached_to=16)
    c = chunk(pool, r, 6)                   # 8..13: SWA pages only, [3, 2]
    assert r.kv.full_pages == [3, 2, 1, 0] and r.kv.swa_pages == [None, None, 3, 2]
    m = check_step(pool, [c])
    f, s = m["full"], m["swa"]
    assert ints(f.kv_indices) == [3, 2, 1, 0] and ints(f.kv_last_page_len) == [2]
    assert ints(f.write_rows) == [] and ints(f.write_slots) == []     # the cache's KV
    assert ints(s.kv_indices) == [3, 2] and ints(s.kv_start_pos) == [8]
    assert ints(s.key_floor) == [8] and not s.needs_floor_mask       # floor page aligned
    assert ints(s.write_rows) == list(range(6))
    assert ints(s.write_slots) == [12, 13, 14, 15, 8, 9]
    commit(pool, c)
    c = chunk(pool, r, 4)                   # 14..17 crosses full_cached_to: full page 4
    assert r.kv.full_pages == [3, 2, 1, 0, 4] and r.kv.swa_pages == [None, None, 3, 2, 4]
    m = check_step(pool, [c])
    f, s = m["full"], m["swa"]
    assert ints(f.kv_indices) == [3, 2, 1, 0, 4] and ints(f.kv_last_page_len) == [2]
    assert ints(f.write_rows) == [2, 3] and ints(f.write_slots) == [16, 17]
    assert ints(s.kv_indices) == [3, 2, 4] and ints(s.kv_start_pos) == [8]
    assert ints(s.write_slots) == [10, 11, 16, 17]


def test_floor_inside_a_page_is_masked():
    pool = make_pool(full_pages=8, swa_pages=8)
    donor = new_seq(pool, 0)
    commit(pool, chunk(pool, donor, 16))
    r = rebuild_seq(pool, 1, donor, floor=6, cached_to=16)
    c = chunk(pool, r, 6)
    m = check_step(pool, [c])["swa"]
    # keys 4 and 5 share the floor's page: in the range, hidden only by the floor
    assert ints(m.kv_start_pos) == [4] and ints(m.key_floor) == [6] and m.needs_floor_mask


def test_decode_batch_all_decode():
    pool = make_pool()
    seqs = [new_seq(pool, i) for i in range(3)]
    for s, n in zip(seqs, (9, 3, 14)):
        commit(pool, chunk(pool, s, n))
    m = check_step(pool, [chunk(pool, s, 1) for s in seqs])
    assert m["full"].all_decode and m["swa"].all_decode
    assert ints(m["swa"].q_start_pos) == [9, 3, 14]
    assert ints(m["swa"].kv_start_pos) == [4, 0, 8]     # first page of (p - 6, p]


def test_released_swa_is_refused():
    pool = make_pool()
    s = new_seq(pool, 0)
    commit(pool, chunk(pool, s, 12))
    c = ScheduledChunk(s, 2, 1, False)      # as if position 2 were recomputed: page 0 is gone
    with pytest.raises(RuntimeError, match="not all live"):
        build_paged_metadata([c], pool, W)


# ---- random steps --------------------------------------------------------------------------
@pytest.mark.parametrize("hybrid", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_random_steps_match_torch_backend(seed, hybrid):
    rnd = random.Random(seed)
    pool = make_pool(full_pages=64, swa_pages=48, hybrid=hybrid, seed=seed)
    live, nid, steps, kinds = [], 0, 0, set()
    rebuild = None
    if hybrid:      # (the full-kv layout has no SWA pool, hence no window rebuild)
        donor = new_seq(pool, 99, seed=seed)
        commit(pool, chunk(pool, donor, 24))
        rebuild = rebuild_seq(pool, 98, donor, floor=rnd.choice([8, 12, 16]), cached_to=24)
        rebuild.prefill_end = 36
        live.append(rebuild)
    while steps < 14:
        if not live or (len(live) < 4 and rnd.random() < 0.5):
            s = new_seq(pool, nid, seed=seed)
            s.prefill_end = rnd.randint(1, 30)
            live.append(s)
            nid += 1
        chunks = []
        for s in rnd.sample(live, len(live)):
            if s.num_computed < s.prefill_end:
                n = rnd.randint(1, min(9, s.prefill_end - s.num_computed))
                chunks.append(chunk(pool, s, n))
                kinds.add("rebuild" if s is rebuild else "prefill")
            else:
                d = [rnd.randint(3, 299) for _ in range(rnd.choice([0, 0, 1, 3]))]
                chunks.append(chunk(pool, s, 1 + len(d), d))
                kinds.add("verify" if d else "decode")
        check_step(pool, chunks, sinks=seed % 2 == 0, split=seed % 3 != 0, seed=seed * 100 + steps)
        for c in chunks:
            commit(pool, c, rnd.randint(1, c.n) if c.draft else None)
        for s in [s for s in live if s is not rebuild and s.num_computed > 40]:
            live.remove(s)
            pool.free_seq(s.kv)         # freed pages come back first: later tables scatter
        steps += 1
    assert kinds == {"prefill", "decode", "verify"} | ({"rebuild"} if hybrid else set())


# ---- a real model forward ------------------------------------------------------------------
@pytest.fixture(scope="module")
def mimo_model():
    from helpers.tiny_models import loaded_from_hf, tiny_mimo_v2_flash_hf

    from mimo.models.registry import build_model
    loaded = loaded_from_hf(tiny_mimo_v2_flash_hf())
    return loaded.config, build_model(loaded.config, loaded.weights, torch.float32)


def test_tiny_mimo_forward_matches_torch_backend(mimo_model):
    cfg, model = mimo_model
    assert cfg.swa_attention_sink and not cfg.full_attention_sink and "full" in cfg.layer_types
    pool = DualPool(KVLayout.from_model(cfg, "float32"), 64, 48, P)
    runner = ModelRunner(model, pool, cfg.kv_layer_types, cfg.sliding_window)
    paged = PagedReferenceBackend()
    a, b = new_seq(pool, 0, seed=5), new_seq(pool, 1, seed=5)
    donor = new_seq(pool, 2, seed=5)
    plan = [lambda: [chunk(pool, a, 10), chunk(pool, donor, 20)],          # prefill
            lambda: [chunk(pool, a, 1), chunk(pool, donor, 4), chunk(pool, b, 7)],  # mixed
            lambda: [chunk(pool, a, 4, [5, 6, 7]), chunk(pool, b, 1)],     # verify + decode
            lambda: [chunk(pool, a, 1), chunk(pool, b, 1)],                # decode
            lambda: [chunk(pool, rebuild_seq(pool, 3, donor, 12, 24), 8), chunk(pool, a, 1)]]
    for step in plan:
        chunks = step()
        ids, pos, ctx, _, _ = runner.prepare(chunks, all_logits=True)
        metas = build_paged_metadata(chunks, pool, cfg.sliding_window,
                                     full_sinks=cfg.full_attention_sink,
                                     swa_sinks=cfg.swa_attention_sink)
        check_invariants(metas, chunks, pool)
        before = [(k.clone(), v.clone()) for k, v in runner.kv]
        want = model(ids, pos, ctx)
        cache_want = [(k.clone(), v.clone()) for k, v in runner.kv]
        for (k, v), (k0, v0) in zip(runner.kv, before):
            k.copy_(k0)
            v.copy_(v0)
        got = model(ids, pos, ForwardContext(runner.kv, metas, paged))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for (k, v), (kw, vw) in zip(runner.kv, cache_want):
            torch.testing.assert_close(k, kw, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(v, vw, rtol=1e-4, atol=1e-4)
        for c in chunks:
            commit(pool, c, 2 if c.draft else None)
