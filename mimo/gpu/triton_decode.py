"""Triton decode attention over one layer kind's paged KV (paged_metadata.py): split-K.

Every entry has one query (a decode row, or one row of a split verify chunk). Its visible keys
are one contiguous run of its range, [lo, kv_len): lo is the window's reach (kv_len - 1 -
window_left), the key floor, or 0, whichever is last. Stage 1 cuts that run into NUM_SPLITS
pieces (multiples of BLOCK_N; a short run leaves the last ones empty), and one program per
(entry, KV head, piece) computes every query head of the group over its piece: a partial
output and its log-sum-exp (base 2; -inf for an empty piece). Stage 2, one program per entry
(all its query heads), merges the pieces; the sink logit joins that merge as one more piece
with no value, so it is folded in exactly once, and a long context is spread over NUM_SPLITS
programs instead of one.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_extend import LOG2E, dims


@triton.jit
def _decode_split_kernel(Q, K, V, MidO, MidLse,
                         qo_indptr, kv_indptr, kv_indices, kv_start_pos, q_start_pos,
                         key_floor, scale_log2, window_left,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_me, stride_mh, stride_ms,
                         GROUP: tl.constexpr, BLOCK_H: tl.constexpr, PAGE: tl.constexpr,
                         D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_DV: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    e = tl.program_id(0)
    hkv = tl.program_id(1)
    sp = tl.program_id(2)
    # This piece of the visible keys [lo, kv_len), in range positions.
    kv_start = tl.load(kv_start_pos + e)
    kv_len = tl.load(q_start_pos + e) + 1 - kv_start
    lo = tl.maximum(tl.load(key_floor + e) - kv_start, 0)
    lo = tl.maximum(lo, tl.where(window_left >= 0, kv_len - 1 - window_left, 0))
    per = (kv_len - lo + NUM_SPLITS - 1) // NUM_SPLITS
    per = (per + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = lo + sp * per
    end = tl.minimum(start + per, kv_len)

    h = tl.arange(0, BLOCK_H)
    h_ok = h < GROUP
    head = hkv * GROUP + h
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV
    base = e * stride_me + head * stride_mh + sp * stride_ms
    if end > start:
        row = tl.load(qo_indptr + e)
        page0 = tl.load(kv_indptr + e)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(Q + row * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                    mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
        m = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
        lsum = tl.zeros([BLOCK_H], dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            j = n0 + tl.arange(0, BLOCK_N)
            j_ok = j < end
            page = tl.load(kv_indices + page0 + j // PAGE, mask=j_ok, other=0)
            slot = page.to(tl.int64) * PAGE + j % PAGE
            k = tl.load(K + slot[None, :] * stride_kt + hkv * stride_kh + offs_d[:, None],
                        mask=j_ok[None, :] & d_ok[:, None], other=0.0)
            s = tl.dot(q, k, input_precision=PREC) * scale_log2
            s = tl.where(j_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new[:, None])
            lsum = lsum * alpha + tl.sum(p, 1)
            v = tl.load(V + slot[:, None] * stride_vt + hkv * stride_vh + offs_dv[None, :],
                        mask=j_ok[:, None] & dv_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m = m_new
        tl.store(MidO + base[:, None] + offs_dv[None, :], acc / lsum[:, None],
                 mask=h_ok[:, None] & dv_ok[None, :])
        tl.store(MidLse + base // stride_ms, m + tl.log2(lsum), mask=h_ok)
    else:
        # An empty piece weighs nothing in the merge: log-sum-exp -inf, output 0.
        tl.store(MidO + base[:, None] + offs_dv[None, :],
                 tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32),
                 mask=h_ok[:, None] & dv_ok[None, :])
        tl.store(MidLse + base // stride_ms,
                 tl.full([BLOCK_H], float("-inf"), dtype=tl.float32), mask=h_ok)


@triton.jit
def _decode_reduce_kernel(MidO, MidLse, Out, Sinks, qo_indptr,
                          stride_me, stride_mh, stride_ms, stride_ot, stride_oh,
                          HQ: tl.constexpr, BLOCK_HQ: tl.constexpr, HAS_SINKS: tl.constexpr,
                          DV: tl.constexpr, BLOCK_DV: tl.constexpr, NUM_SPLITS: tl.constexpr):
    e = tl.program_id(0)
    head = tl.arange(0, BLOCK_HQ)
    h_ok = head < HQ
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = h_ok[:, None] & (offs_dv < DV)[None, :]
    acc = tl.zeros([BLOCK_HQ, BLOCK_DV], dtype=tl.float32)
    # The running max stays finite (a sink, or -1e30): an empty piece's -inf adds 0.
    if HAS_SINKS:
        m = tl.load(Sinks + head, mask=h_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        lsum = tl.full([BLOCK_HQ], 1.0, dtype=tl.float32)
    else:
        m = tl.full([BLOCK_HQ], -1.0e30, dtype=tl.float32)
        lsum = tl.zeros([BLOCK_HQ], dtype=tl.float32)
    for sp in range(NUM_SPLITS):
        base = e * stride_me + head * stride_mh + sp * stride_ms
        lse = tl.load(MidLse + base // stride_ms, mask=h_ok, other=float("-inf"))
        o = tl.load(MidO + base[:, None] + offs_dv[None, :], mask=mask, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * alpha[:, None] + w[:, None] * o
        lsum = lsum * alpha + w
        m = m_new
    row = tl.load(qo_indptr + e)
    lsum = tl.where(h_ok, lsum, 1.0)        # padding heads: nothing merged, nothing stored
    tl.store(Out + row * stride_ot + head[:, None] * stride_oh + offs_dv[None, :],
             (acc / lsum[:, None]).to(Out.dtype.element_ty), mask=mask)


def decode_attention(q, k_cache, v_cache, out, meta, scale: float, sinks,
                     num_splits: int = 8, block_n: int = 32) -> None:
    """out rows of `meta`'s entries <- attention; every entry must have one query.
    Shapes as `extend_attention`. Partial results: [E, Hq, num_splits, Dv] float32."""
    E, hq, hkv = meta.num_entries, q.shape[1], k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    group = hq // hkv
    bd, bdv, prec = dims(q, v_cache)
    dv = v_cache.shape[-1]
    mid_o = torch.empty(E, hq, num_splits, dv, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(E, hq, num_splits, dtype=torch.float32, device=q.device)
    # mid_lse shares mid_o's (entry, head, split) strides divided by Dv: one offset for both.
    sm = (mid_o.stride(0), mid_o.stride(1), mid_o.stride(2))
    _decode_split_kernel[(E, hkv, num_splits)](
        q, k_cache, v_cache, mid_o, mid_lse,
        meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_start_pos, meta.q_start_pos,
        meta.key_floor, scale * LOG2E, meta.window_left,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), *sm,
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), PAGE=meta.page_size,
        D=q.shape[-1], DV=dv, BLOCK_D=bd, BLOCK_DV=bdv, NUM_SPLITS=num_splits,
        BLOCK_N=block_n, PREC=prec)
    _decode_reduce_kernel[(E,)](
        mid_o, mid_lse, out, sinks if sinks is not None else q, meta.qo_indptr, *sm,
        out.stride(0), out.stride(1),
        HQ=hq, BLOCK_HQ=triton.next_power_of_2(hq), HAS_SINKS=sinks is not None, DV=dv,
        BLOCK_DV=bdv, NUM_SPLITS=num_splits)
