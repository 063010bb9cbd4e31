"""Triton extend (prefill) attention over one layer kind's paged KV (paged_metadata.py).

One program: `BLOCK_Q` queries of one entry times every query head of one KV head (GQA heads
are folded into the rows, so K/V are read once per group), looping over the entry's key range
in blocks of `BLOCK_N` (online softmax, base 2). Keys are addressed through the entry's page
list: key j of the range (absolute position kv_start_pos + j) lies in page
kv_indices[kv_indptr[e] + j // PAGE] at offset j % PAGE. The range ends at the entry's last
query, so the query i of the entry sits at range position kv_len - qo_len + i; that covers a
cached prefix, causal order within the chunk and a verify chunk alike.

A query at q sees key j iff j <= q, q - j <= window_left (when >= 0) and j >= the key floor;
the loop only visits the blocks some query of the program may see. A sink logit joins the
softmax exactly as the torch reference's extra column: the running max starts at the sink and
the running sum at exp(0) = 1, with no value added.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
NEG = -1.0e30       # running-max start without a sink: finite, so a fully masked block is safe


@triton.jit
def _extend_kernel(Q, K, V, Out, Sinks,
                   qo_indptr, kv_indptr, kv_indices, kv_start_pos, q_start_pos, key_floor,
                   scale_log2, window_left,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_ot, stride_oh,
                   GROUP: tl.constexpr, GP: tl.constexpr, PAGE: tl.constexpr,
                   HAS_SINKS: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_Q: tl.constexpr,
                   BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    e = tl.program_id(0)
    hkv = tl.program_id(1)
    qb = tl.program_id(2)
    row0 = tl.load(qo_indptr + e)
    qo_len = tl.load(qo_indptr + e + 1) - row0
    if qb * BLOCK_Q < qo_len:
        kv_start = tl.load(kv_start_pos + e)
        qpos0 = tl.load(q_start_pos + e) - kv_start        # range position of query 0
        kv_len = qpos0 + qo_len
        floor = tl.load(key_floor + e) - kv_start
        page0 = tl.load(kv_indptr + e)

        r = tl.arange(0, BLOCK_Q * GP)
        qi = qb * BLOCK_Q + r // GP
        g = r % GP
        head = hkv * GROUP + g
        row_ok = (qi < qo_len) & (g < GROUP)
        qrel = qpos0 + qi
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        d_ok = offs_d < D
        dv_ok = offs_dv < DV
        q = tl.load(Q + (row0 + qi)[:, None] * stride_qt + head[:, None] * stride_qh
                    + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)

        acc = tl.zeros([BLOCK_Q * GP, BLOCK_DV], dtype=tl.float32)
        if HAS_SINKS:
            m = tl.load(Sinks + head, mask=g < GROUP, other=0.0).to(tl.float32) * 1.4426950408889634
            lsum = tl.full([BLOCK_Q * GP], 1.0, dtype=tl.float32)
        else:
            m = tl.full([BLOCK_Q * GP], -1.0e30, dtype=tl.float32)
            lsum = tl.zeros([BLOCK_Q * GP], dtype=tl.float32)

        # Keys any query of this block may see: [lo, hi). The floor binds every query of
        # the entry alike, so starting the loop there is its whole mask.
        first_q = qpos0 + qb * BLOCK_Q
        hi = tl.minimum(first_q + BLOCK_Q, kv_len)
        lo = tl.maximum(floor, 0)
        lo = tl.maximum(lo, tl.where(window_left >= 0, first_q - window_left, 0))
        for n0 in range(lo, hi, BLOCK_N):
            j = n0 + tl.arange(0, BLOCK_N)
            j_ok = j < hi
            page = tl.load(kv_indices + page0 + j // PAGE, mask=j_ok, other=0)
            slot = page.to(tl.int64) * PAGE + j % PAGE
            k = tl.load(K + slot[None, :] * stride_kt + hkv * stride_kh + offs_d[:, None],
                        mask=j_ok[None, :] & d_ok[:, None], other=0.0)
            s = tl.dot(q, k, input_precision=PREC) * scale_log2
            vis = row_ok[:, None] & j_ok[None, :] & (j[None, :] <= qrel[:, None])
            vis = vis & ((window_left < 0) | (qrel[:, None] - j[None, :] <= window_left))
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new[:, None])
            lsum = lsum * alpha + tl.sum(p, 1)
            v = tl.load(V + slot[:, None] * stride_vt + hkv * stride_vh + offs_dv[None, :],
                        mask=j_ok[:, None] & dv_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m = m_new

        lsum = tl.where(lsum > 0, lsum, 1.0)
        out = acc / lsum[:, None]
        tl.store(Out + (row0 + qi)[:, None] * stride_ot + head[:, None] * stride_oh
                 + offs_dv[None, :], out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & dv_ok[None, :])


def dims(q: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, str]:
    """(BLOCK_D, BLOCK_DV, dot precision): power-of-two blocks of at least 16 (tl.dot's
    minimum; 192 runs as 256 with the tail masked), IEEE products for float32 (no TF32)."""
    bd = max(16, triton.next_power_of_2(q.shape[-1]))
    bdv = max(16, triton.next_power_of_2(v_cache.shape[-1]))
    return bd, bdv, "ieee" if q.dtype == torch.float32 else "tf32"


def extend_attention(q, k_cache, v_cache, out, meta, scale: float, sinks, max_qo_len: int,
                     block_q: int | None = None, block_n: int = 32) -> None:
    """out[T, Hq, Dv] <- attention of every entry of `meta` (any query counts).
    q [T, Hq, D]; k_cache [slots, Hkv, D], v_cache [slots, Hkv, Dv] (slot = page * PAGE +
    offset); `max_qo_len`: the longest entry (the grid's third axis)."""
    hq, hkv = q.shape[1], k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    group = hq // hkv
    gp = triton.next_power_of_2(group)
    # Rows = queries x heads of the group; at least 16 rows (tl.dot), 64 by default.
    bq = block_q or max(1, 64 // gp)
    bq = max(bq, -(-16 // gp))
    bd, bdv, prec = dims(q, v_cache)
    grid = (meta.num_entries, hkv, triton.cdiv(max_qo_len, bq))
    _extend_kernel[grid](
        q, k_cache, v_cache, out, sinks if sinks is not None else q,
        meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_start_pos, meta.q_start_pos,
        meta.key_floor, scale * LOG2E, meta.window_left,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
        GROUP=group, GP=gp, PAGE=meta.page_size, HAS_SINKS=sinks is not None,
        D=q.shape[-1], DV=v_cache.shape[-1], BLOCK_D=bd, BLOCK_DV=bdv, BLOCK_Q=bq,
        BLOCK_N=block_n, PREC=prec)
