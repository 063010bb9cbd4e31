"""KVFrame: a run of pages of one layer of a request's prompt KV, copied to host memory as
soon as they are final, so that a prefill worker can send them while later layers and
chunks are still being computed.

A payload (`KVPayload`) is the sum of its frames: layer j's frames cover its payload rows
page by page, in order, with no gap and no overlap (for an SWA layer, page 0 is the
payload's `swa_first_page`). `PayloadCollector` assembles them back into a payload.

Each frame owns its tensors: they are gathered from the pool (`index_select` makes new
tensors, never views of the pool), so the pool's pages may be overwritten or reused right
after `copy_pages` returns. On a CUDA pool the host tensors are pinned and filled by an
asynchronous copy queued on the compute stream after the layer that wrote the pages;
`ready` is the event that copy completes at, and a reader waits for it (`wait`) before it
touches the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .kv_payload import KVPayload, page_slots


@dataclass(frozen=True, eq=False)
class KVFrame:
    layer: int                  # payload order: the full layers, then the SWA layers
    first_page: int             # within the layer's payload rows (SWA: from swa_first_page)
    pages: int
    k: torch.Tensor             # host [pages * page_size, kv_heads, k_dim]
    v: torch.Tensor
    ready: Any = None           # torch.cuda.Event of the device-to-host copy; None: done

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def wait(self) -> None:
        """Block until the bytes are in host memory (a no-op for a CPU pool)."""
        if self.ready is not None:
            self.ready.synchronize()


def copy_pages(k_cache: torch.Tensor, v_cache: torch.Tensor, pages: list[int],
               page_size: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(K, V, ready): host copies of `pages` of one layer's cache tensors (see the module
    docstring for why the pool may be reused at once)."""
    idx = page_slots(pages, page_size, k_cache.device)
    k, v = k_cache.index_select(0, idx), v_cache.index_select(0, idx)
    if k.device.type != "cuda":
        return k, v, None
    hk = torch.empty(k.shape, dtype=k.dtype, pin_memory=True)
    hv = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
    hk.copy_(k, non_blocking=True)
    hv.copy_(v, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return hk, hv, ready


class PayloadCollector:
    """A frame sink that assembles one request's frames into a `KVPayload` (an engine and its
    tests or benches in one process; the workers' stream does the same on the decode side)."""

    def __init__(self, empty: KVPayload):
        self.payload = empty
        layers = empty.full + empty.swa
        self._rows = [k.shape[0] // empty.page_size for k, _ in layers]
        self.filled = [0] * len(layers)       # pages received, per layer
        self.frames = 0

    @property
    def complete(self) -> bool:
        return self.filled == self._rows

    def put(self, frame: KVFrame) -> bool:
        place(self.payload, frame, self.filled)
        self.frames += 1
        return True


def place(payload: KVPayload, frame: KVFrame, filled: list[int]) -> None:
    """Copy `frame` into `payload`; `filled[layer]` (pages so far) must be its first page.
    ValueError for a frame out of order or shaped for another payload."""
    layers = payload.full + payload.swa
    if not 0 <= frame.layer < len(layers):
        raise ValueError(f"KV frame for layer {frame.layer} of {len(layers)}")
    k, v = layers[frame.layer]
    P = payload.page_size
    if frame.first_page != filled[frame.layer] or frame.pages < 1 or \
            (frame.first_page + frame.pages) * P > k.shape[0]:
        raise ValueError(f"KV frame of layer {frame.layer}: pages {frame.first_page}+"
                         f"{frame.pages} after {filled[frame.layer]} of {k.shape[0] // P}")
    rows = slice(frame.first_page * P, (frame.first_page + frame.pages) * P)
    frame.wait()
    k[rows].copy_(frame.k)
    v[rows].copy_(frame.v)
    filled[frame.layer] += frame.pages
