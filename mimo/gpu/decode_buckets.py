"""Decode batches padded to a few fixed sizes, with paged metadata in static buffers: what a
CUDA graph of the decode step needs (its shapes and tensor addresses fixed at capture).

Sizes, as vLLM and SGLang capture them: 1, 2, 4, then every multiple of 8 up to the most
sequences a step runs (that number last). A step of n decodes runs at the smallest size
B >= n; its B - n padding rows must leave the pools untouched and stay finite. SGLang points
padding rows at a reserved dummy KV slot; our pools reserve none, so a padding row repeats
the step's first row instead:
- its K/V write is row 0's write again (same source row, same slot, identical values: a
  duplicate index in `index_copy_` cannot change what lands there);
- its attention range is the one key row 0 just wrote (the last page of row 0's range, key
  floor at row 0's position), so it reads written, finite values only.
Its output is discarded. The metadata of every size are views of one set of buffers sized
for the largest: filling them for a step updates the tensors every captured graph reads.
"""
from __future__ import annotations

import torch

from .paged_metadata import PagedAttnMeta

_FIELDS = ("kv_indptr", "kv_last_page_len", "kv_start_pos", "q_start_pos", "key_floor",
           "entry_chunk", "positions", "write_rows", "write_slots")


def decode_buckets(max_seqs: int) -> tuple[int, ...]:
    """Padded batch sizes for steps of up to `max_seqs` decodes."""
    if max_seqs < 1:
        raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
    sizes = [b for b in (1, 2, 4) if b < max_seqs] + list(range(8, max_seqs, 8))
    return tuple(sizes + [max_seqs])


def bucket_for(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest size that holds `n` rows (None: more than the largest)."""
    return next((b for b in buckets if b >= n), None)


class StaticDecodeMeta:
    """One layer kind's paged metadata for padded decode steps of up to `max_rows` rows, at
    most `max_pages` pages per row's key range. `max_kv_len` is recorded as the most keys a
    range can hold, so a kernel's split count (decided from it) is the same every step."""

    def __init__(self, kind: str, page_size: int, window_left: int, has_sinks: bool,
                 max_rows: int, max_pages: int, device):
        self.kind, self.page_size = kind, page_size
        self.window_left, self.has_sinks = window_left, has_sinks
        self.max_rows, self.max_pages = max_rows, max_pages
        z = dict(dtype=torch.int32, device=device)
        self.qo_indptr = torch.arange(max_rows + 1, **z)     # one query per row, always
        self.kv_indices = torch.zeros(max_rows * max_pages, **z)
        self.buf = {f: torch.zeros(max_rows + (f == "kv_indptr"), **z) for f in _FIELDS}
        self._views: dict[int, PagedAttnMeta] = {}

    def view(self, rows: int) -> PagedAttnMeta:
        """The metadata of a step of `rows` (padded) rows: fixed tensors, same every call."""
        if rows not in self._views:
            b = self.buf
            self._views[rows] = PagedAttnMeta(
                kind=self.kind, page_size=self.page_size, window_left=self.window_left,
                has_sinks=self.has_sinks, qo_indptr=self.qo_indptr[:rows + 1],
                kv_indptr=b["kv_indptr"][:rows + 1], kv_indices=self.kv_indices,
                kv_last_page_len=b["kv_last_page_len"][:rows],
                kv_start_pos=b["kv_start_pos"][:rows], q_start_pos=b["q_start_pos"][:rows],
                key_floor=b["key_floor"][:rows], entry_chunk=b["entry_chunk"][:rows],
                positions=b["positions"][:rows], write_rows=b["write_rows"][:rows],
                write_slots=b["write_slots"][:rows], all_decode=True, needs_floor_mask=True,
                max_qo_len=1, max_kv_len=self.max_pages * self.page_size)
        return self._views[rows]

    def fill(self, meta: PagedAttnMeta, rows: int) -> bool:
        """Copy a step's metadata (host tensors of n one-query entries that write every row,
        as `build_paged_metadata` makes for plain decodes) into the buffers, padded to `rows`.
        False, nothing usable written, when the step does not fit this shape."""
        n = meta.num_entries
        if not (meta.all_decode and 0 < n <= rows <= self.max_rows
                and meta.write_rows.numel() == n and meta.kind == self.kind):
            return False
        pages = meta.kv_indptr.diff()
        if int(pages.max()) > self.max_pages or \
                not torch.equal(meta.write_rows, torch.arange(n, dtype=meta.write_rows.dtype)):
            return False
        pad = rows - n
        nnz = int(meta.kv_indptr[-1])
        q0 = int(meta.q_start_pos[0])
        P = self.page_size
        last_page = meta.kv_indices[int(meta.kv_indptr[1]) - 1:int(meta.kv_indptr[1])]

        def ext(t: torch.Tensor, value) -> torch.Tensor:
            return torch.cat([t.to(torch.int32), torch.full((pad,), int(value), dtype=torch.int32)])
        host = {
            "kv_indptr": torch.cat([meta.kv_indptr.to(torch.int32),
                                    nnz + torch.arange(1, pad + 1, dtype=torch.int32)]),
            "kv_last_page_len": ext(meta.kv_last_page_len, q0 % P + 1),
            "kv_start_pos": ext(meta.kv_start_pos, q0 - q0 % P),
            "q_start_pos": ext(meta.q_start_pos, q0),
            "key_floor": ext(meta.key_floor, q0),
            "entry_chunk": ext(meta.entry_chunk, 0),
            "positions": ext(meta.positions, q0),
            "write_rows": ext(meta.write_rows, 0),
            "write_slots": ext(meta.write_slots, meta.write_slots[0]),
        }
        indices = torch.cat([meta.kv_indices.to(torch.int32), last_page.to(torch.int32).repeat(pad)])
        self.kv_indices[:nnz + pad].copy_(indices, non_blocking=True)
        for f, t in host.items():
            self.buf[f][:t.numel()].copy_(t, non_blocking=True)
        return True
