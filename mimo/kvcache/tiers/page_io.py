"""PageIO: whole pages of one pool kind as rows, the unit every lower tier stores.

A row holds one page of one kind (full or SWA): for each of the pool's layers in order, the
page's K slots then its V slots, flattened ([page_size, kv_heads, dim] each). The same row
is an L2 slot and the payload of an L3 entry, so moving a page between tiers is one copy
per layer and no re-layout.

`scatter` copies layer by layer. On CUDA it runs on a side stream and records one event
per layer (`LayerReady`), so a forward that waits on layer i's event before reading layer
i's cache can overlap the copy of later layers with its compute. The model does not wait
per layer yet: the compute stream waits for the whole load (correct, not overlapped). On
the CPU it is a plain copy.
"""
from __future__ import annotations

import torch

from ..pool.kv_pool import KVPool


class LayerReady:
    """Per-layer completion of a layer-wise load (CUDA events; empty on the CPU)."""
    def __init__(self, events: list | None = None):
        self.events = events or []

    def wait(self, layer: int) -> None:
        if self.events:
            torch.cuda.current_stream().wait_event(self.events[layer])


class PageIO:
    def __init__(self, pool: KVPool):
        self.pool = pool
        P = self.P = pool.page_size
        self.layers = len(pool.layers)
        self.parts = [(P * lay.kv_heads * lay.k_dim, P * lay.kv_heads * lay.v_dim)
                      for lay in pool.layers]
        self.row_elems = sum(k + v for k, v in self.parts)
        self.dtype = pool.k(0).dtype if self.layers else torch.float32
        self.device = pool.k(0).device if self.layers else torch.device("cpu")
        self.row_bytes = self.row_elems * torch.empty((), dtype=self.dtype).element_size()
        self._stream = (torch.cuda.Stream(self.device)
                        if self.device.type == "cuda" else None)

    def _slots(self, pages: list[int]) -> torch.Tensor:
        p = torch.tensor(pages, dtype=torch.int64)
        return (p[:, None] * self.P + torch.arange(self.P)).reshape(-1).to(self.device)

    def gather(self, pages: list[int]) -> torch.Tensor:
        """Rows [len(pages), row_elems] of these pages, a new host tensor (a snapshot: the
        pages may be reused as soon as this returns)."""
        n = len(pages)
        if n == 0 or not self.layers:
            return torch.empty(n, self.row_elems, dtype=self.dtype)
        idx = self._slots(pages)
        pieces = []
        for i in range(self.layers):
            pieces.append(self.pool.k(i).index_select(0, idx).reshape(n, -1))
            pieces.append(self.pool.v(i).index_select(0, idx).reshape(n, -1))
        return torch.cat(pieces, dim=1).cpu()

    def scatter(self, pages: list[int], rows: torch.Tensor) -> LayerReady:
        """Write rows into these pages, layer by layer (see the module docstring)."""
        n = len(pages)
        if n == 0 or not self.layers:
            return LayerReady()
        if rows.shape != (n, self.row_elems) or rows.dtype != self.dtype:
            raise ValueError(f"rows {tuple(rows.shape)} {rows.dtype} do not fit {n} pages of "
                             f"{self.row_elems} {self.dtype}")
        idx = self._slots(pages)
        events = []
        ctx = torch.cuda.stream(self._stream) if self._stream is not None else None
        if ctx is not None:
            ctx.__enter__()
        try:
            off = 0
            for i, (ke, ve) in enumerate(self.parts):
                k, v = self.pool.k(i), self.pool.v(i)
                src = rows[:, off:off + ke].to(self.device, non_blocking=True)
                k.index_copy_(0, idx, src.reshape(n * self.P, *k.shape[1:]))
                off += ke
                src = rows[:, off:off + ve].to(self.device, non_blocking=True)
                v.index_copy_(0, idx, src.reshape(n * self.P, *v.shape[1:]))
                off += ve
                if self._stream is not None:
                    ev = torch.cuda.Event()
                    ev.record(self._stream)
                    events.append(ev)
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        if self._stream is not None:
            # Until the model waits per layer (LayerReady.wait), the compute stream waits
            # for the whole load: correct, with the copy still off the host thread.
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
        return LayerReady(events)

    def rows_from_bytes(self, blobs: list[bytes | memoryview]) -> torch.Tensor | None:
        """Stack L3 payloads into rows; None if any has the wrong size (a corrupt or
        foreign entry: the caller treats the whole set as missing)."""
        if any(len(b) != self.row_bytes for b in blobs):
            return None
        if not blobs:
            return torch.empty(0, self.row_elems, dtype=self.dtype)
        buf = bytearray().join(blobs)      # one copy, writable (torch.frombuffer shares it)
        return torch.frombuffer(buf, dtype=torch.uint8).view(self.dtype).reshape(
            len(blobs), self.row_elems)

    @staticmethod
    def row_bytes_of(rows: torch.Tensor) -> list[bytes]:
        """Payloads of rows (called off the engine thread: rows is a private snapshot)."""
        flat = rows.contiguous().view(torch.uint8).numpy()
        return [flat[i].tobytes() for i in range(flat.shape[0])]
