"""Paged-attention metadata of one engine step, per layer kind (FlashInfer-style CSR).

The torch backend (attention.py) reads per-token slot lists; a paged kernel instead takes,
per layer kind, page ids in that kind's own pool plus a few per-sequence integers. This module
builds those, from the same scheduled chunks and page tables `ModelRunner.prepare` reads, with
the same attention semantics as `build_attn_batch`:

- full layers: a query at position p sees keys [0, p]; a window rebuild's positions below
  `SeqKV.full_cached_to` are read from the prefix cache's pages and not written;
- SWA layers: keys (p - window, p], none below `SeqKV.swa_floor` (a rebuild computes its SWA
  KV from there); the pages come from `SeqKV.swa_pages` (`full_to_swa` is not consulted:
  a rebuild's SWA pages beside shared full pages are deliberately unmapped there). Pages
  released before the window are not in the range: it starts at the first page the window
  (or floor) needs, and `kv_start_pos` says which absolute position its first key has;
- a verify chunk (drafts): by default each of its rows is its own one-query entry, exactly as
  the runner batches them with the decodes (so accepted tokens match plain decoding); with
  `split_verify=False` it is one causal entry of 1 + len(draft) queries.

An *entry* is one (sequence, query span); E entries, T query rows in chunk order.
Invariants of every entry e (tests/gpu/test_paged_metadata.py checks them):
  kv_len[e] = (kv_indptr[e+1] - kv_indptr[e] - 1) * page_size + kv_last_page_len[e]
            = q_start_pos[e] + qo_len[e] - kv_start_pos[e]
i.e. the key range ends at the entry's last query (FlashInfer's bottom-right causal
alignment), key j has absolute position kv_start_pos[e] + j, and kv_start_pos is page
aligned. A query at q sees key k iff k <= q, q - k <= window_left (when >= 0), k >= key_floor.
Because the window is a difference of positions, a kernel may apply causal + window_left on
range-relative positions; only the floor needs absolute ones, and only when
`needs_floor_mask` (a floor that is not page aligned; RadixTree.match's never are).

No import of engine or kvcache: gpu sits below them (docs/architecture.md).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


# What this module reads of the scheduler's chunks and the KV pools: kernels know no
# scheduler and no allocator (engine.ScheduledChunk, kvcache.SeqKV and DualPool fit these).
class SeqKVView(Protocol):
    @property
    def full_pages(self) -> Sequence[int | None]: ...
    @property
    def swa_pages(self) -> Sequence[int | None]: ...
    @property
    def swa_floor(self) -> int: ...
    @property
    def full_cached_to(self) -> int: ...


class _SeqView(Protocol):
    @property
    def kv(self) -> Any: ...            # a SeqKVView (None only before admission)


class ChunkView(Protocol):
    @property
    def seq(self) -> _SeqView: ...
    @property
    def start(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def draft(self) -> list[int]: ...


class PoolView(Protocol):
    @property
    def page_size(self) -> int: ...
    @property
    def hybrid(self) -> bool: ...


KINDS = ("full", "swa")


@dataclass(frozen=True)
class PagedAttnMeta:
    kind: str                   # 'full' or 'swa'
    page_size: int
    window_left: int            # earlier keys a query may see (window - 1); -1: unbounded
    has_sinks: bool             # the kind's layers have per-head sink logits (kernel folds them)
    qo_indptr: torch.Tensor     # [E+1] rows of entry e: qo_indptr[e] : qo_indptr[e+1]
    kv_indptr: torch.Tensor     # [E+1] pages of entry e: kv_indices[kv_indptr[e] : kv_indptr[e+1]]
    kv_indices: torch.Tensor    # [nnz] page ids in this kind's pool, in position order
    kv_last_page_len: torch.Tensor  # [E] keys in the entry's last page, 1..page_size
    kv_start_pos: torch.Tensor  # [E] absolute position of the range's first key (page aligned)
    q_start_pos: torch.Tensor   # [E] absolute position of the entry's first query
    key_floor: torch.Tensor     # [E] no query of the entry sees a key below this position
    entry_chunk: torch.Tensor   # [E] index of the entry's chunk in the step
    positions: torch.Tensor     # [T] absolute position of every query row (masks, not mRoPE)
    write_rows: torch.Tensor    # [Tw] rows whose new K/V this kind's layers write ...
    write_slots: torch.Tensor   # [Tw] ... to these slots (page * page_size + offset)
    all_decode: bool            # every entry has one query (a decode kernel suffices)
    needs_floor_mask: bool      # some floor cuts keys that causal + window alone would show
    # Host copies of the longest entry's queries and keys (a kernel's grid and split count
    # need them; reading them back from device tensors would synchronise). 0: not recorded.
    max_qo_len: int = 0
    max_kv_len: int = 0

    @property
    def num_entries(self) -> int:
        return self.qo_indptr.numel() - 1

    @property
    def kv_len(self) -> torch.Tensor:
        """[E] keys in each entry's range."""
        npages = self.kv_indptr[1:] - self.kv_indptr[:-1]
        return (npages - 1) * self.page_size + self.kv_last_page_len


def _entries(chunks, split_verify: bool):
    """(chunk index, first row, first position, queries, SeqKV) per entry, in row order."""
    row = 0
    for ci, c in enumerate(chunks):
        if c.draft and split_verify:
            for i in range(c.n):
                yield ci, row + i, c.start + i, 1, c.seq.kv
        else:
            yield ci, row, c.start, c.n, c.seq.kv
        row += c.n


def _pages(kv, kind: str, hybrid: bool) -> list:
    # In the full-kv layout SWA layers live in the full pool like every layer.
    return kv.swa_pages if kind == "swa" and hybrid else kv.full_pages


def _kind_meta(kind: str, chunks, pool: PoolView, window: int | None, sinks: bool,
               split_verify: bool, device) -> PagedAttnMeta:
    P = pool.page_size
    qo, kvp, idx, last, kstart, qstart, floors, ech = [0], [0], [], [], [], [], [], []
    needs_floor = False
    for ci, _row, start, n, kv in _entries(chunks, split_verify):
        end = start + n
        pages = _pages(kv, kind, pool.hybrid)
        if kind == "swa":
            # As build_attn_batch: the floor never hides a query's own key.
            floor = min(kv.swa_floor, start)
            reach = max(0, start - window + 1) if window is not None else 0
            lo = max(reach, floor)
        else:
            floor = lo = 0
        first, npages = lo // P, -(-end // P)
        span = pages[first:npages]
        if npages > len(pages) or any(p is None for p in span):
            raise RuntimeError(f"{kind} KV of positions [{lo}, {end}) is not all live: pages "
                               f"{first}..{npages - 1} of a table of {len(pages)}")
        idx.extend(span)
        qo.append(qo[-1] + n)
        kvp.append(kvp[-1] + len(span))
        last.append(end - (npages - 1) * P)
        kstart.append(first * P)
        qstart.append(start)
        floors.append(floor)
        ech.append(ci)
        needs_floor |= floor > max(first * P, reach if kind == "swa" else 0)
    # Writes follow chunks, not entries: a split verify chunk still writes each row once.
    wrows, wslots, pos, row = [], [], [], 0
    for c in chunks:
        kv = c.seq.kv
        pages = _pages(kv, kind, pool.hybrid)
        w0 = c.start if kind == "swa" else max(c.start, kv.full_cached_to)
        for p in range(w0, c.start + c.n):
            wrows.append(row + p - c.start)
            wslots.append(pages[p // P] * P + p % P)
        pos.extend(range(c.start, c.start + c.n))
        row += c.n

    def t(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    qo_len = [b - a for a, b in zip(qo, qo[1:])]
    return PagedAttnMeta(
        kind=kind, page_size=P,
        window_left=window - 1 if kind == "swa" and window is not None else -1,
        has_sinks=sinks, qo_indptr=t(qo), kv_indptr=t(kvp), kv_indices=t(idx),
        kv_last_page_len=t(last), kv_start_pos=t(kstart), q_start_pos=t(qstart),
        key_floor=t(floors), entry_chunk=t(ech), positions=t(pos), write_rows=t(wrows),
        write_slots=t(wslots), all_decode=all(n == 1 for n in qo_len),
        needs_floor_mask=needs_floor, max_qo_len=max(qo_len),
        max_kv_len=max(q + n - k for q, n, k in zip(qstart, qo_len, kstart)))


def build_paged_metadata(chunks: Iterable[ChunkView], pool: PoolView,
                         window: int | None, *, full_sinks: bool = False,
                         swa_sinks: bool = False, device: str | torch.device = "cpu",
                         split_verify: bool = True,
                         kinds: tuple[str, ...] = KINDS) -> dict[str, PagedAttnMeta]:
    """Metadata of one step for each layer kind the model has: {'full': ..., 'swa': ...}
    (the keys of `ForwardContext.batches`). `window`: the model's sliding window (keys an SWA
    query sees, itself included; ModelConfig.sliding_window), None for a model without SWA
    layers (then no 'swa' entry). `full_sinks` / `swa_sinks`: ModelConfig's
    full_attention_sink / swa_attention_sink. Chunks must already be grown in `pool`
    (Scheduler._chunk does) and their SWA KV not yet released past the window. `kinds`:
    the kinds wanted (the MTP layers' own pass needs only 'swa')."""
    chunks = list(chunks)
    if not chunks:
        raise ValueError("no chunks scheduled")
    out = {}
    if "full" in kinds:
        out["full"] = _kind_meta("full", chunks, pool, None, full_sinks, split_verify, device)
    if window is not None and "swa" in kinds:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        out["swa"] = _kind_meta("swa", chunks, pool, window, swa_sinks, split_verify, device)
    return out
