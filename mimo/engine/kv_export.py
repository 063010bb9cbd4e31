"""KVExporter: a prefill worker's engine hands a request's prompt KV over frame by frame,
each frame as soon as its pages are final, so that sending overlaps the prefill.

A request marked for export (`Sequence.kv_export`, a `KVExport`) moves every full layer's
pages and only the window of each SWA layer (`kv_payload`). While its prompt runs:

- after each decoder layer of a step (the model calls `ForwardContext.after_layer`), a
  full layer's pages that this step completed go out: pages wholly below the chunk's end
  (the partial last page only once the prompt's last chunk ran it); pages an earlier chunk
  or the prefix cache completed went out with the first layer call that saw them;
- in the prompt's last chunk, each SWA layer's window goes out right after that layer;
- after the step (`finish`), whatever is final and was not sent: layers the model's layer
  loop does not reach (MTP layers' KV, kept SWA-shaped) and models that call no hook.

So the engine thread alone reads the pools; a frame owns host copies (`kv_frames`), put
into the request's sink (a thread-safe queue the sender drains; `FrameSink.put` returns at
once). A request that fails or is aborted simply stops producing frames: whoever reads
the sink learns the end from the request's own stream. Engine thread only.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..kvcache.kv_frames import KVFrame, copy_pages
from ..kvcache.kv_payload import window_first_page

if TYPE_CHECKING:
    from ..kvcache.pool.dual_pool import DualPool
    from .scheduled_chunk import ScheduledChunk


class FrameSink(Protocol):
    def put(self, frame: KVFrame) -> bool:
        """Take `frame` (thread-safe, never blocks); False: the reader is gone."""
        ...


@dataclass(eq=False)
class KVExport:
    """One request's export: where its frames go and how many pages of each payload layer
    (full layers, then SWA layers) went there so far."""
    sink: FrameSink
    sent: list[int] = field(default_factory=list)
    frames: int = 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVExporter:
    def __init__(self, pool: DualPool, slots: list[tuple[str, int]]):
        """`slots`: per decoder layer (model order), its pool kind and index there."""
        self.pool = pool
        nf = len(pool.layout.full)
        self._layers = nf + len(pool.layout.swa)
        # model layer -> payload layer (full layers first, then SWA ones)
        self._payload_layer = [j if kind == "full" else nf + j for kind, j in slots]

    def layer_hook(self, chunks: list[ScheduledChunk]) -> Callable[[int], None] | None:
        """The step's `after_layer` callback, or None when no chunk exports (every other step
        runs exactly as without it)."""
        todo = [c for c in chunks if c.seq.kv_export is not None and not c.draft]
        if not todo:
            return None
        payload_layer = self._payload_layer

        def after_layer(i: int) -> None:
            if i < len(payload_layer):
                for c in todo:
                    self._emit(c, payload_layer[i])
        return after_layer

    def finish(self, chunks: list[ScheduledChunk]) -> None:
        """After the step, before window release: every final page not sent yet."""
        for c in chunks:
            if c.seq.kv_export is not None and not c.draft:
                for j in range(self._layers):
                    self._emit(c, j)

    def _emit(self, c: ScheduledChunk, j: int) -> None:
        """Hand over layer `j`'s pages that are final after chunk `c` and not sent yet."""
        seq, pool = c.seq, self.pool
        exp = seq.kv_export
        assert exp is not None
        if not exp.sent:
            exp.sent = [0] * self._layers
        n, P = len(seq.prompt_ids), pool.page_size
        last = c.start + c.n >= n
        kv = seq.running_kv
        nf = len(pool.layout.full)
        lo = exp.sent[j]
        if j < nf:
            hi = _cdiv(n, P) if last else (c.start + c.n) // P
            if hi <= lo:
                return
            k, v, ready = copy_pages(pool.full.k(j), pool.full.v(j), kv.full_pages[lo:hi], P)
        else:
            if not last or lo:
                return
            first = window_first_page(n, pool.window, P)
            window = kv.swa_pages[first:_cdiv(n, P)]
            if any(p is None for p in window):
                raise RuntimeError("the SWA window to export was already released")
            hi = len(window)
            k, v, ready = copy_pages(pool.swa.k(j - nf), pool.swa.v(j - nf),
                                     [p for p in window if p is not None], P)
        exp.sent[j] = hi
        exp.frames += 1
        exp.sink.put(KVFrame(j, lo, hi - lo, k, v, ready))
