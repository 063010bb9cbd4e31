"""Attention over paged KV.

The runner describes one step's batch once per layer kind (`AttnBatch`: where new K/V go,
which cache slots each sequence's queries read, and the masks); every layer of that kind
reuses it. A backend only writes K/V and computes attention; it knows nothing of pages,
pools or requests, so a FlashInfer backend can replace the torch one behind this interface.

Sequences with one query token (decode) are batched into one padded SDPA call; longer ones
(prefill chunks) run one call each.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

DECODE_KEY_BUCKET = 64     # decode key counts are padded to a multiple of this
# A prefill chunk's queries go to SDPA in blocks of this many, each with only the keys some
# query of the block sees: the CPU flash kernel computes every block of an explicit mask,
# and a window's band or a causal triangle leaves much of [queries, keys] masked.
PREFILL_QUERY_BLOCK = 128


@dataclass
class PrefillSpan:
    rows: slice                 # this sequence's query rows in the flattened batch
    kv_slots: torch.Tensor      # [L] cache slots of the keys it reads, in position order
    # (query rows, key columns) of each block, both relative to the span; every key a query
    # of the block may see lies in its columns (the visible keys of a query are contiguous).
    blocks: list[tuple[slice, slice]] | None = None
    # What each query sees: query i sees keys j with j <= offset + i and, when window > 0,
    # j > offset + i - window (kernels that take no mask read these).
    offset: int = 0
    window: int = 0
    _mask: torch.Tensor | None = None

    @property
    def mask(self) -> torch.Tensor:
        """[q, L] bool (True: may attend), the same visibility as a mask; built when a path
        first asks (mimo's CPU kernels never do: a long chunk's mask is millions of bools)."""
        if self._mask is None:
            n, L = self.rows.stop - self.rows.start, self.kv_slots.shape[0]
            kpos = torch.arange(L, device=self.kv_slots.device)
            qpos = torch.arange(self.offset, self.offset + n, device=self.kv_slots.device)
            m = kpos[None, :] <= qpos[:, None]
            if self.window:
                m &= kpos[None, :] > qpos[:, None] - self.window
            self._mask = m
        return self._mask


def _query_blocks(start: int, n: int, lo: int, window: int | None) -> list[tuple[slice, slice]]:
    """Blocks of a chunk of queries at positions [start, start + n) over keys from `lo` (the
    first key any of them sees: the window's and the key floor's bound, `build_attn_batch`)."""
    out = []
    for a in range(0, n, PREFILL_QUERY_BLOCK):
        b = min(a + PREFILL_QUERY_BLOCK, n)
        k0 = lo if window is None else max(lo, start + a - window + 1)
        out.append((slice(a, b), slice(k0 - lo, start + b - lo)))
    return out


@dataclass
class AttnBatch:
    write_slots: torch.Tensor             # [len(write_rows) or T] slots the new K/V go to
    decode_rows: torch.Tensor | None      # [B] rows of single-token sequences
    decode_slots: torch.Tensor | None     # [B, L] slots read by each (padded)
    prefills: list[PrefillSpan]
    all_decode: bool = False              # every row is a decode row, in order
    # Rows whose K/V are written (None: every row). A window rebuild recomputes positions
    # whose full-layer KV is already cached in shared pages: those rows are not written.
    write_rows: torch.Tensor | None = None
    decode_lens: torch.Tensor | None = None   # [B] int64: keys each decode row reads (unpadded)
    # A backend's own description of `prefills`, built by the first layer that needs it and
    # reused by the rest of the step's layers of this kind (CPUAttention: its span table).
    backend_spans: object = None
    mask_dtype: torch.dtype = torch.float32   # of `decode_mask`
    _mask: tuple[torch.Tensor | None] | None = field(default=None, repr=False)

    @property
    def decode_mask(self) -> torch.Tensor | None:
        """[B, 1, 1, L] additive (0 or -inf) hiding each decode row's padded keys (the
        trailing ones past `decode_lens`); None: no row is padded. Built when a path first
        asks: the fused decode layers read the lengths, and a step's Python is much of a
        small model's decode step (docs/speed.md)."""
        if self._mask is None:
            mask = None
            slots, lens = self.decode_slots, self.decode_lens
            if slots is not None and lens is not None and int(lens.min()) < slots.shape[1]:
                B, L = slots.shape
                keys = torch.arange(L, device=slots.device)
                mask = torch.zeros(B, L, dtype=self.mask_dtype, device=slots.device)
                mask.masked_fill_(keys[None, :] >= lens[:, None], float("-inf"))
                mask = mask.view(B, 1, 1, L)
            self._mask = (mask,)
        return self._mask[0]


def build_attn_batch(seqs, window: int | None, slots_fn, device, mask_dtype) -> AttnBatch:
    """seqs: iterable of (row_start, start_pos, n_new, handle, key_floor, write_from);
    slots_fn(handle, a, b) gives cache slots of positions [a, b). A query at position p
    sees keys in (p - window, p] when `window` is set, else [0, p], and none below
    `key_floor` (a window rebuild's first computed position: its SWA KV starts there).
    Positions below `write_from` are read from the cache, not written (0: write all).
    Few tensor ops per row: this runs twice in every decode step."""
    write, wrows, dec_rows, dec_slots, prefills = [], [], [], [], []
    skipped = False
    for row, start, n, handle, floor, write_from in seqs:
        end = start + n
        lo = 0 if window is None else max(0, start - window + 1)
        lo = max(lo, min(floor, start))
        slots = slots_fn(handle, lo, end)
        w0 = min(max(write_from - start, 0), n)
        skipped |= w0 > 0
        write.append(slots[start - lo + w0:])
        wrows.append((row + w0, row + n))
        if n == 1:
            dec_rows.append(row)
            dec_slots.append(slots)
        else:
            prefills.append(PrefillSpan(slice(row, row + n), slots.to(device),
                                        _query_blocks(start, n, lo, window), start - lo,
                                        window or 0))
    ws = write[0] if len(write) == 1 else torch.cat(write)
    batch = AttnBatch(ws.to(device), None, None, prefills, mask_dtype=mask_dtype)
    if skipped:
        batch.write_rows = torch.cat([torch.arange(a, b) for a, b in wrows]).to(device)
    if dec_rows:
        lens = [len(s) for s in dec_slots]
        # Padded up to a bucket: on CPU, oneDNN builds a new bf16 matmul primitive for every
        # new shape (about a millisecond), and the key count grows by one each step.
        L = -(-max(lens) // DECODE_KEY_BUCKET) * DECODE_KEY_BUCKET
        idx = torch.zeros(len(dec_slots), L, dtype=torch.int64)
        for i, s in enumerate(dec_slots):
            idx[i, :len(s)] = s
        batch.decode_rows = torch.tensor(dec_rows, dtype=torch.int64, device=device)
        batch.decode_slots = idx.to(device)
        batch.decode_lens = torch.tensor(lens, dtype=torch.int64, device=device)
        batch.all_decode = not prefills and dec_rows == list(range(len(dec_rows)))
    return batch


class AttentionBackend(ABC):
    # True: the backend reads paged metadata (paged_metadata.PagedAttnMeta: page ids and
    # per-entry integers) instead of AttnBatch, and the runner builds that for it.
    paged: bool = False

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttnBatch,
                scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, Hq, Dv].
        Writes k/v (the `batch.write_rows` of them, if set) into the caches at
        `batch.write_slots` first."""


def _sdpa(q, k, v, mask, scale, sinks):
    """q [B, Hq, n, D], k/v [B, Hkv, L, D]; mask bool or additive, broadcastable."""
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])
    # Attention sink: a per-head logit joining the softmax with no value (MiMo SWA layers).
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    sk = sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
    p = torch.softmax(torch.cat([s, sk], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(p, v.float()).to(q.dtype)


def _decode_attention(q, k, v, mask, scale, sinks):
    """One query per sequence. q [B, Hq, D], k [B, L, Hkv, D], v [B, L, Hkv, Dv], additive
    mask [B, 1, 1, L]. Without sinks, one SDPA call: on CPU (torch 2.13) its flash kernel
    takes a single query at 1/3 of the time of the two batched matmuls below for one
    sequence, and no more for 16 (docs/speed.md). Sinks need the explicit softmax."""
    B, Hq, D = q.shape
    Hkv = k.shape[2]
    if sinks is None:
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            scale=scale, enable_gqa=Hq != Hkv)                               # [B, Hq, 1, Dv]
        return o.view(B, Hq, -1)
    qg = q.view(B, Hkv, Hq // Hkv, D)
    s = torch.matmul(qg, k.permute(0, 2, 3, 1)).float() * scale       # [B, Hkv, rep, L]
    if mask is not None:
        s = s + mask.view(B, 1, 1, -1).float()
    if sinks is not None:
        sk = sinks.float().view(1, Hkv, Hq // Hkv, 1).expand(B, -1, -1, 1)
        p = torch.softmax(torch.cat([s, sk], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    o = torch.matmul(p.to(v.dtype), v.permute(0, 2, 1, 3))                  # [B, Hkv, rep, Dv]
    return o.reshape(B, Hq, -1)


class TorchAttention(AttentionBackend):
    """Reference backend on any device: gather the keys of each sequence, then SDPA."""

    @staticmethod
    def write(k, v, k_cache, v_cache, batch: AttnBatch) -> None:
        """The step's new K/V into the caches (the `write_rows` of them, if set)."""
        if batch.write_rows is None:
            k_cache.index_copy_(0, batch.write_slots, k)
            v_cache.index_copy_(0, batch.write_slots, v)
        else:
            k_cache.index_copy_(0, batch.write_slots, k.index_select(0, batch.write_rows))
            v_cache.index_copy_(0, batch.write_slots, v.index_select(0, batch.write_rows))

    def forward(self, q, k, v, k_cache, v_cache, batch, scale, sinks=None):
        self.write(k, v, k_cache, v_cache, batch)
        if batch.all_decode:
            B, L = batch.decode_slots.shape
            flat = batch.decode_slots.reshape(-1)
            kd = k_cache.index_select(0, flat).view(B, L, *k_cache.shape[1:])
            vd = v_cache.index_select(0, flat).view(B, L, *v_cache.shape[1:])
            return _decode_attention(q, kd, vd, batch.decode_mask, scale, sinks)
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        if batch.decode_rows is not None:
            B, L = batch.decode_slots.shape
            flat = batch.decode_slots.reshape(-1)
            # index_select, not advanced indexing: the latter is erratically slow on CPU.
            kd = k_cache.index_select(0, flat).view(B, L, *k_cache.shape[1:])
            vd = v_cache.index_select(0, flat).view(B, L, *v_cache.shape[1:])
            od = _decode_attention(q.index_select(0, batch.decode_rows), kd, vd,
                                   batch.decode_mask, scale, sinks)
            out.index_copy_(0, batch.decode_rows, od)
        for span in batch.prefills:
            out[span.rows] = self.prefill_span(q, k_cache, v_cache, span, scale, sinks)
        return out

    @staticmethod
    def prefill_span(q, k_cache, v_cache, span, scale, sinks) -> torch.Tensor:
        """One prefill chunk's rows of `q` against the keys its span reads: [n, Hq, Dv]."""
        qp = q[span.rows].transpose(0, 1).unsqueeze(0)                        # [1, Hq, n, D]
        kp = k_cache.index_select(0, span.kv_slots).transpose(0, 1).unsqueeze(0)
        vp = v_cache.index_select(0, span.kv_slots).transpose(0, 1).unsqueeze(0)
        n, L = qp.shape[2], kp.shape[2]
        if sinks is None and span.offset == 0 and n == L and (span.window == 0 or n <= span.window):
            # The mask is the plain causal triangle (a chunk from its sequence's first key):
            # no mask tensor, and the flash kernel skips the blocks above the diagonal.
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale,
                                                enable_gqa=qp.shape[1] != kp.shape[1])
        elif span.blocks is None or len(span.blocks) == 1:
            op = _sdpa(qp, kp, vp, span.mask, scale, sinks)
        else:
            op = torch.cat([_sdpa(qp[:, :, r], kp[:, :, c], vp[:, :, c], span.mask[r, c],
                                  scale, sinks) for r, c in span.blocks], dim=2)
        return op.squeeze(0).transpose(0, 1)
