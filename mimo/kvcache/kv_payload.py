"""KVPayload: one request's prompt KV as a hybrid-SWA model needs it moved between workers.

A payload of `tokens` positions holds, for every full-attention layer, the K/V of all
positions [0, tokens) (whole pages), and for every SWA layer only the pages from
`swa_first_page` on: the window the next queries read. The first query after the prompt
(position tokens) sees keys (tokens - window, tokens]; a receiver that recomputes the last
prompt token instead (position tokens - 1) sees one more, so the window starts at
tokens - window. Everything older is never read again and never moved.

Tensors are host copies ([pages * page_size, kv_heads, dim] per layer): the sender makes
them frame by frame as its pages become final (`kv_frames.KVFrame`), and the receiver holds
them in host memory until its scheduler admits the request (`import_payload` copies them
onto the pool's device, layer by layer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .pool.layout import KVLayout

if TYPE_CHECKING:
    from .pool.dual_pool import DualPool
    from .pool.seq_kv import SeqKV


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def window_first_page(tokens: int, window: int, page_size: int) -> int:
    """First logical page an SWA layer must keep for queries at positions tokens - 1 on."""
    return max(0, tokens - window) // page_size


@dataclass
class KVPayload:
    tokens: int                 # positions [0, tokens) have full-layer KV here
    page_size: int
    swa_first_page: int         # SWA KV covers pages [swa_first_page, cdiv(tokens, P))
    full: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    swa: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def num_pages(self) -> int:
        return _cdiv(self.tokens, self.page_size)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                   for k, v in self.full + self.swa)

    @classmethod
    def empty(cls, layout: KVLayout, tokens: int, page_size: int, dtype: torch.dtype
              ) -> KVPayload:
        """Host buffers for a payload of this shape (a receiver's reservation, filled layer
        by layer as the bytes arrive)."""
        first, full, swa = payload_shapes(layout, tokens, page_size)

        def bufs(shapes):
            return [(torch.empty(ks, dtype=dtype), torch.empty(vs, dtype=dtype))
                    for ks, vs in shapes]
        return cls(tokens, page_size, first, bufs(full), bufs(swa))

    def check_fits(self, pool: DualPool) -> None:
        """Raise ValueError unless this payload's paging, shapes and dtype are `pool`'s."""
        first, full, swa = payload_shapes(pool.layout, self.tokens, pool.page_size)
        if self.page_size != pool.page_size or self.swa_first_page != first:
            raise ValueError("KV payload paged differently from this pool")
        have = [(tuple(k.shape), tuple(v.shape)) for k, v in self.full + self.swa]
        if have != full + swa:
            raise ValueError(f"KV payload layers shaped {have[:1]}... (x{len(have)}), the pool "
                             f"wants {(full + swa)[:1]}... (x{len(full + swa)})")
        dtype = pool.full.k(0).dtype if pool.layout.full else None
        if dtype is not None and any(k.dtype != dtype or v.dtype != dtype
                                     for k, v in self.full + self.swa):
            raise ValueError(f"KV payload dtype differs from the pool's {dtype}")


Shape = tuple[int, int, int]


def payload_shapes(layout: KVLayout, tokens: int, page_size: int
                   ) -> tuple[int, list[tuple[Shape, Shape]], list[tuple[Shape, Shape]]]:
    """(swa_first_page, full layers' (K, V) shapes, SWA layers' (K, V) shapes) of a payload
    of `tokens` positions."""
    if tokens < 1:
        raise ValueError("a KV payload covers at least one token")
    pages = _cdiv(tokens, page_size)
    first = window_first_page(tokens, layout.window, page_size) if layout.swa else 0

    def shapes(layers, n):
        return [((n * page_size, lay.kv_heads, lay.k_dim), (n * page_size, lay.kv_heads, lay.v_dim))
                for lay in layers]
    return first, shapes(layout.full, pages), shapes(layout.swa, pages - first)


def full_kv_bytes(layout: KVLayout, tokens: int) -> int:
    """Bytes a layout that keeps every layer's KV for every token (no SWA saving) holds for
    `tokens` positions: the yardstick of a transfer's size."""
    per_token = sum(lay.elems for lay in layout.full + layout.swa) * layout.dtype_bytes
    return per_token * tokens


def page_slots(pages: list[int], page_size: int, device) -> torch.Tensor:
    p = torch.tensor(pages, dtype=torch.int64)
    return (p[:, None] * page_size + torch.arange(page_size)).reshape(-1).to(device)


def import_payload(pool: DualPool, kv: SeqKV, payload: KVPayload) -> None:
    """Copy a payload into the pages `DualPool.grow_imported` gave `kv`, layer by layer."""
    pages = payload.num_pages
    if pool.layout.full:
        idx = page_slots(kv.full_pages[:pages], pool.page_size, pool.full.k(0).device)
        for i, (k, v) in enumerate(payload.full):
            pool.full.k(i).index_copy_(0, idx, k.to(pool.full.k(i).device))
            pool.full.v(i).index_copy_(0, idx, v.to(pool.full.v(i).device))
    if pool.hybrid and payload.swa:
        window = [p for p in kv.swa_pages[payload.swa_first_page:pages] if p is not None]
        assert len(window) == pages - payload.swa_first_page, "SWA window pages missing"
        idx = page_slots(window, pool.page_size, pool.swa.k(0).device)
        for i, (k, v) in enumerate(payload.swa):
            pool.swa.k(i).index_copy_(0, idx, k.to(pool.swa.k(i).device))
            pool.swa.v(i).index_copy_(0, idx, v.to(pool.swa.v(i).device))
