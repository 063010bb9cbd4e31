"""The Triton extend and decode kernels (mimo/gpu/triton_extend.py, triton_decode.py) against
a brute-force float64 softmax attention, on random paged layouts built here.

Each layout: a pool of pages filled with random K/V, entries whose pages are drawn at random
from it (scattered, in any order), and a mix of decodes (some long: many split-K pieces),
prefill chunks over a cached prefix, verify chunks (2-4 causal queries), key floors inside a
page, ranges that start a page earlier than needed (keys hidden only by the masks). The
reference reads each entry's keys by page id and masks by absolute positions (causal, window,
floor), with the sink logit as one more softmax column; the kernels run in float32 (the
interpreter on CPU), tolerance 2e-5 absolute and relative.
"""
from __future__ import annotations

import random

import pytest
import torch

from mimo.gpu.paged_metadata import PagedAttnMeta

TOL = dict(atol=2e-5, rtol=2e-5)
# (query heads, KV heads, q/k head dim, v head dim): MHA, GQA 4:1, a group of 3 (padded to
# 4 rows), odd dims, and MiMo-V2-Flash's 192 / 128 with a group of 4.
HEADS = [(4, 4, 16, 16), (4, 1, 32, 16), (6, 2, 24, 16), (8, 2, 192, 128)]


def _i32(x, dev):
    return torch.tensor(x, dtype=torch.int32, device=dev)


def make_meta(entries, page_size, window, dev, pages_of) -> PagedAttnMeta:
    """entries: (q_start, qo_len, key_floor, extra_page); pages_of(e, n) gives n page ids."""
    qo, kvp, idx, last, kstart, qstart, floors = [0], [0], [], [], [], [], []
    for e, (start, n, floor, extra) in enumerate(entries):
        end = start + n
        reach = max(0, start - window + 1) if window else 0
        first = max(reach, floor) // page_size
        first = max(0, first - extra)       # a page of keys only the masks hide
        npages = -(-end // page_size)
        idx += pages_of(e, npages - first)
        qo.append(qo[-1] + n)
        kvp.append(len(idx))
        last.append(end - (npages - 1) * page_size)
        kstart.append(first * page_size)
        qstart.append(start)
        floors.append(floor)
    return PagedAttnMeta(
        kind="swa" if window else "full", page_size=page_size,
        window_left=window - 1 if window else -1, has_sinks=False, qo_indptr=_i32(qo, dev),
        kv_indptr=_i32(kvp, dev), kv_indices=_i32(idx, dev), kv_last_page_len=_i32(last, dev),
        kv_start_pos=_i32(kstart, dev), q_start_pos=_i32(qstart, dev),
        key_floor=_i32(floors, dev), entry_chunk=_i32(list(range(len(entries))), dev),
        positions=_i32([p for s, n, _, _ in entries for p in range(s, s + n)], dev),
        write_rows=_i32([], dev), write_slots=_i32([], dev),
        all_decode=all(n == 1 for _, n, _, _ in entries), needs_floor_mask=True)


def brute_force(meta, q, k_cache, v_cache, scale, sinks):
    """float64 attention of every entry, keys gathered by page id, masks by position."""
    P = meta.page_size
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=torch.float64)
    for e in range(meta.num_entries):
        r0, r1 = int(meta.qo_indptr[e]), int(meta.qo_indptr[e + 1])
        pages = meta.kv_indices[int(meta.kv_indptr[e]):int(meta.kv_indptr[e + 1])].long().cpu()
        ks, qs = int(meta.kv_start_pos[e]), int(meta.q_start_pos[e])
        L = qs + r1 - r0 - ks
        slots = (pages[:, None] * P + torch.arange(P)).reshape(-1)[:L]
        K, V = k_cache.cpu()[slots].double(), v_cache.cpu()[slots].double()
        kpos, qpos = ks + torch.arange(L), qs + torch.arange(r1 - r0)
        m = (kpos[None] <= qpos[:, None]) & (kpos[None] >= int(meta.key_floor[e]))
        if meta.window_left >= 0:
            m &= qpos[:, None] - kpos[None] <= meta.window_left
        rep = q.shape[1] // K.shape[1]
        K, V = K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1)
        s = torch.einsum("qhd,khd->hqk", q[r0:r1].cpu().double(), K) * scale
        s = s.masked_fill(~m[None], float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.cpu().double().view(-1, 1, 1).expand(-1, r1 - r0, 1)], -1)
        out[r0:r1] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1)[..., :L], V)
    return out


def random_entries(rnd: random.Random, window):
    """A batch mixing every kind of entry; floors only below the entry's first query."""
    out = []
    for kind in rnd.sample(["decode", "long", "prefill", "prefix", "verify", "decode"], 6):
        if kind == "decode":
            start, n = rnd.randint(0, 40), 1
        elif kind == "long":
            start, n = rnd.randint(90, 160), 1
        elif kind == "prefill":
            start, n = 0, rnd.randint(2, 20)
        elif kind == "prefix":          # a chunk after a cached prefix
            start, n = rnd.randint(5, 60), rnd.randint(2, 12)
        else:
            start, n = rnd.randint(8, 70), rnd.randint(2, 4)
        floor = rnd.randint(0, start) if rnd.random() < 0.4 else 0
        out.append((start, n, floor, rnd.randint(0, 1)))
    return out


def run_case(seed, heads, page_size, window, sinks_on, dev, num_splits=3, block_n=16):
    from mimo.gpu.triton_decode import decode_attention
    from mimo.gpu.triton_extend import extend_attention
    rnd = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    hq, hkv, d, dv = heads
    npool = 200 // page_size + 16
    k_cache = torch.randn(npool * page_size, hkv, d, generator=g).to(dev)
    v_cache = torch.randn(npool * page_size, hkv, dv, generator=g).to(dev)
    sinks = (torch.randn(hq, generator=g) * 2).to(dev) if sinks_on else None
    scale = d ** -0.5
    entries = random_entries(rnd, window)
    meta = make_meta(entries, page_size, window, dev,
                     lambda e, n: rnd.sample(range(npool), n))
    T = int(meta.qo_indptr[-1])
    q = torch.randn(T, hq, d, generator=g).to(dev)
    want = brute_force(meta, q, k_cache, v_cache, scale, sinks)
    out = torch.full((T, hq, dv), float("nan"), device=dev)
    max_qo = max(n for _, n, _, _ in entries)
    extend_attention(q, k_cache, v_cache, out, meta, scale, sinks, max_qo, block_n=block_n)
    torch.testing.assert_close(out.cpu().double(), want, **TOL)
    # The decode kernel on the one-query entries (same pages, rows renumbered).
    dec = [i for i, (_, n, _, _) in enumerate(entries) if n == 1]
    rows = [int(meta.qo_indptr[i]) for i in dec]
    pages = [meta.kv_indices[int(meta.kv_indptr[i]):int(meta.kv_indptr[i + 1])].tolist()
             for i in dec]
    dmeta = make_meta([entries[i] for i in dec], page_size, window, dev,
                      lambda e, n: pages[e][-n:])
    assert dmeta.all_decode
    dout = torch.full((len(dec), hq, dv), float("nan"), device=dev)
    decode_attention(q[rows].contiguous(), k_cache, v_cache, dout, dmeta, scale, sinks,
                     num_splits, block_n)
    torch.testing.assert_close(dout.cpu().double(), want[rows], **TOL)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "x".join(map(str, h)))
def test_triton_kernels_random_layouts(seed, heads, triton_device):
    rnd = random.Random(1000 + seed)
    page_size = rnd.choice([1, 4, 16])
    window = rnd.choice([None, 5, 16])
    run_case(seed, heads, page_size, window, sinks_on=seed % 2 == 1, dev=triton_device)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("sinks_on", [False, True])
def test_triton_kernels_windows_and_sinks(window, sinks_on, triton_device):
    """Every combination of window and sink on one layout (page 4, GQA 2:1)."""
    run_case(7, (4, 2, 16, 16), 4, window, sinks_on, triton_device)


def test_triton_decode_split_k_long_context(triton_device):
    """One 600-key decode (window off, then 100) split into 1, 5 and 8 pieces: the same
    output each time; the sink joins the merge once, not once per piece."""
    from mimo.gpu.triton_decode import decode_attention
    dev = triton_device
    g = torch.Generator().manual_seed(3)
    P, hq, hkv, d = 8, 4, 2, 16
    k_cache = torch.randn(100 * P, hkv, d, generator=g).to(dev)
    v_cache = torch.randn(100 * P, hkv, d, generator=g).to(dev)
    sinks = (torch.randn(hq, generator=g) * 3).to(dev)
    q = torch.randn(2, hq, d, generator=g).to(dev)
    perm = torch.randperm(100, generator=g).tolist()
    for window in (None, 100):
        meta = make_meta([(599, 1, 0, 0), (250, 1, 7, 0)], P, window, dev,
                         lambda e, n: perm[e * 50:e * 50 + n][::-1] if e else perm[20:20 + n])
        want = brute_force(meta, q, k_cache, v_cache, d ** -0.5, sinks)
        for splits in (1, 5, 8):
            out = torch.empty(2, hq, d, device=dev)
            decode_attention(q, k_cache, v_cache, out, meta, d ** -0.5, sinks, splits, 32)
            torch.testing.assert_close(out.cpu().double(), want, **TOL)


def test_triton_kernels_bfloat16(triton_device):
    """bfloat16 caches and queries (the serving dtype): float32 accumulation, output within
    bfloat16 rounding of the float64 result. Compiled only: Triton 3.9's interpreter
    multiplies bfloat16 operands of tl.dot wrongly (a 16x16 product off by 1e10)."""
    from mimo.gpu.triton_extend import extend_attention
    dev = triton_device
    if dev == "cpu":
        pytest.skip("the Triton interpreter's bfloat16 tl.dot is wrong; run on a GPU")
    g = torch.Generator().manual_seed(5)
    P, hq, hkv, d = 4, 4, 2, 32
    kc = torch.randn(64 * P, hkv, d, generator=g).to(dev, torch.bfloat16)
    vc = torch.randn(64 * P, hkv, d, generator=g).to(dev, torch.bfloat16)
    rnd = random.Random(5)
    meta = make_meta([(20, 6, 0, 0), (9, 1, 0, 0)], P, 8, dev,
                     lambda e, n: rnd.sample(range(64), n))
    q = torch.randn(7, hq, d, generator=g).to(dev, torch.bfloat16)
    sinks = torch.randn(hq, generator=g).to(dev, torch.bfloat16)
    out = torch.empty(7, hq, d, device=dev, dtype=torch.bfloat16)
    extend_attention(q, kc, vc, out, meta, d ** -0.5, sinks, 6)
    want = brute_force(meta, q, kc, vc, d ** -0.5, sinks)
    torch.testing.assert_close(out.cpu().double(), want, atol=2e-2, rtol=2e-2)


def test_triton_backend_without_host_lengths(triton_device):
    """Metadata with no host copies of its longest entry (built here, not by
    build_paged_metadata): the backend reads them back and still splits a long decode."""
    from mimo.gpu.triton_attention import TritonAttention
    dev = triton_device
    g = torch.Generator().manual_seed(11)
    P, hq, hkv, d = 4, 4, 2, 16
    kc = torch.randn(80 * P, hkv, d, generator=g).to(dev)
    vc = torch.randn(80 * P, hkv, d, generator=g).to(dev)
    rnd = random.Random(11)
    backend = TritonAttention(num_splits=4, min_split_keys=32, block_n=16)
    for entries in ([(150, 1, 0, 0), (3, 1, 0, 0)], [(40, 5, 9, 1), (7, 1, 0, 0)]):
        meta = make_meta(entries, P, None, dev, lambda e, n: rnd.sample(range(80), n))
        assert meta.max_qo_len == meta.max_kv_len == 0
        T = int(meta.qo_indptr[-1])
        q = torch.randn(T, hq, d, generator=g).to(dev)
        out = backend.forward(q, q[:, :hkv], q[:, :hkv], kc, vc, meta, d ** -0.5)
        torch.testing.assert_close(out.cpu().double(), brute_force(meta, q, kc, vc, d ** -0.5,
                                                                   None), **TOL)
