"""The Triton attention backend: paged kernels over one layer kind's pool.

Its batches are `PagedAttnMeta` (paged_metadata.py), not the torch backend's `AttnBatch`:
`paged = True` tells the runner to build those. A step whose entries all have one query
(decodes, split verify chunks) runs the split-K decode kernel (triton_decode.py); any other
step runs the extend kernel (triton_extend.py) over every entry, decodes included.

On a CPU tensor the kernels only run under Triton's interpreter (TRITON_INTERPRET=1 set before
this module is imported): the tests' way to check them without a GPU.
"""
from __future__ import annotations

from .attention import AttentionBackend
from .paged_metadata import PagedAttnMeta
from .triton_decode import decode_attention
from .triton_extend import extend_attention


class TritonAttention(AttentionBackend):
    """`num_splits`: most pieces a decode's keys are cut into; a step uses fewer when its
    longest range has under `min_split_keys` keys a piece (short contexts: one piece).
    `block_n`: keys per inner block; `block_q`: queries per extend program (None: 64 rows
    of queries x group heads)."""
    paged = True

    def __init__(self, num_splits: int = 8, min_split_keys: int = 256, block_n: int = 32,
                 block_q: int | None = None):
        if num_splits < 1 or min_split_keys < 1 or block_n < 16 or block_n & (block_n - 1):
            raise ValueError(f"num_splits and min_split_keys must be >= 1 and block_n a power "
                             f"of two >= 16, got {num_splits}, {min_split_keys}, {block_n}")
        if block_q is not None and (block_q < 1 or block_q & (block_q - 1)):
            raise ValueError(f"block_q must be a power of two (tl.arange), got {block_q}")
        self.num_splits, self.min_split_keys = num_splits, min_split_keys
        self.block_n, self.block_q = block_n, block_q
        self._host: tuple[PagedAttnMeta | None, int, int] = (None, 0, 0)

    def _lengths(self, meta: PagedAttnMeta) -> tuple[int, int]:
        """(longest entry's queries, its keys): the metadata's host copies, or (when it has
        none) read back once per metadata object, which every layer of a kind shares."""
        if meta.max_qo_len and meta.max_kv_len:
            return meta.max_qo_len, meta.max_kv_len
        if self._host[0] is not meta:
            qo = meta.qo_indptr[1:] - meta.qo_indptr[:-1]
            self._host = (meta, int(qo.max()), int(meta.kv_len.max()))
        return self._host[1], self._host[2]

    def forward(self, q, k, v, k_cache, v_cache, batch, scale, sinks=None):
        if not isinstance(batch, PagedAttnMeta):
            raise TypeError(f"the Triton backend takes PagedAttnMeta batches, not "
                            f"{type(batch).__name__} (build them with build_paged_metadata)")
        meta = batch
        if meta.write_rows.numel():
            rows = meta.write_rows.long()
            slots = meta.write_slots.long()
            k_cache.index_copy_(0, slots, k.index_select(0, rows))
            v_cache.index_copy_(0, slots, v.index_select(0, rows))
        if q.stride(-1) != 1:
            q = q.contiguous()
        if sinks is not None and sinks.numel() != q.shape[1]:
            raise ValueError(f"{sinks.numel()} sink logits for {q.shape[1]} query heads")
        out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
        max_qo, max_kv = self._lengths(meta)
        if meta.all_decode:
            splits = max(1, min(self.num_splits, -(-max_kv // self.min_split_keys)))
            decode_attention(q, k_cache, v_cache, out, meta, scale, sinks, splits, self.block_n)
        else:
            extend_attention(q, k_cache, v_cache, out, meta, scale, sinks, max_qo,
                             self.block_q, self.block_n)
        return out
