"""The one place that turns scheduled requests into tensors and runs the model."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..gpu.attention import AttentionBackend, TorchAttention, build_attn_batch
from ..gpu.paged_metadata import build_paged_metadata
from ..kvcache.pool.dual_pool import DualPool
from ..kvcache.pool.seq_kv import SeqKV
from ..models.context import ForwardContext
from .scheduler import ScheduledChunk
from .sequence import Sequence

if TYPE_CHECKING:
    from .graph_decode import BucketedDecode


class ModelRunner:
    def __init__(self, model, pool: DualPool, layer_types: tuple[str, ...], window: int,
                 device: str = "cpu", backend: AttentionBackend | None = None):
        self.model = model
        self.pool = pool
        self.device = torch.device(device)
        self.window = window
        self.backend = backend or TorchAttention()
        # The padded, graph-ready step of plain decodes (graph_decode.py; None: off).
        self.bucketed: BucketedDecode | None = None
        self.mask_dtype = next(model.parameters()).dtype
        # `layer_types`: kinds of every KV-owning layer (ModelConfig.kv_layer_types: the
        # decoder layers, then any MTP layers, so ctx.kv[num_layers + k] is MTP layer k's).
        # Layer i -> its cache tensors: SWA layers live in the SWA pool in the hybrid
        # layout, in the full pool (like every layer) in the full-kv layout.
        self.has_swa = "swa" in layer_types
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.slots: list[tuple[str, int]] = []      # per layer: its pool and index there
        nf = ns = 0
        for t in layer_types:
            if t == "swa" and pool.hybrid:
                self.kv.append((pool.swa.k(ns), pool.swa.v(ns)))
                self.slots.append(("swa", ns))
                ns += 1
            else:
                self.kv.append((pool.full.k(nf), pool.full.v(nf)))
                self.slots.append(("full", nf))
                nf += 1
        # The current step's per-layer callback (ForwardContext.after_layer); the engine
        # sets it around a step that hands KV over layer by layer (kv_export.py).
        self.layer_hook: Callable[[int], None] | None = None

    def execute(self, chunks: list[ScheduledChunk], all_logits: bool = False) -> torch.Tensor:
        """Run one step. Returns final hidden states for the chunks with `sample` set, in
        order: one row each, or 1 + len(draft) rows for a verify chunk (with `all_logits`,
        for every scheduled token instead: scoring and tests)."""
        if self.bucketed is not None and not all_logits:
            out = self.bucketed.run(chunks)
            if out is not None:
                return out
        *args, kw = self.prepare(chunks, all_logits)
        return self.model(*args, **kw)

    def prepare(self, chunks: list[ScheduledChunk], all_logits: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, ForwardContext, torch.Tensor | None, dict]:
        """(input_ids, positions, ctx, logit_rows, keyword args) of one step: the model's
        forward arguments (keywords only for multimodal steps: `mm_embeds`).
        The same ctx also serves the model's MTP layers (`mtp_forward`) for these positions."""
        ids: list[int] = []
        pos: list[int] = []
        rows: list[int] = []
        spans: list[tuple[int, int, int, SeqKV]] = []     # (row, start, tokens, its pages)
        # Any multimodal sequence in the step: positions become [3, T] (text rows repeat
        # their position on all three axes) and its media rows get vision embeddings.
        mm = any(c.seq.mm is not None for c in chunks)
        pos3, mm_rows, mm_embs = [], [], []
        row = 0
        # A step the fused decode layers can take (few rows, text only, slot-list attention)
        # runs every chunk as one-query rows, as verify chunks always do: each row reads its
        # own keys, all rows' K/V written first. A short prefill (a cached prompt's last
        # page, a short prompt) then takes one C++ call per layer instead of the plain layers.
        fused_rows = getattr(self.model, "fused_rows", None)
        as_rows = (not mm and not self.backend.paged and fused_rows is not None
                   and sum(c.n for c in chunks) <= fused_rows())
        for c in chunks:
            # A verify chunk: the last known token, then the draft (not part of the sequence).
            toks = c.seq.all_ids[c.start:c.start + c.n - len(c.draft)] + c.draft
            ids.extend(toks)
            pos.extend(range(c.start, c.start + c.n))
            if mm:
                if c.seq.mm is None:
                    pos3.append(torch.arange(c.start, c.start + c.n).expand(3, -1))
                else:
                    p3, r, e = c.seq.mm.chunk(c.start, c.n)
                    pos3.append(p3)
                    if r.numel():
                        mm_rows.append(r + row)
                        mm_embs.append(e)
            kv = c.seq.running_kv
            if c.draft or as_rows:
                # Verify rows attend exactly as decode rows would (batched with the other
                # decodes, same kernel), so accepted tokens match plain decoding.
                spans.extend((row + i, c.start + i, 1, kv) for i in range(c.n))
            else:
                spans.append((row, c.start, c.n, kv))
            # (a window rebuild: SWA keys start at swa_floor; full KV below full_cached_to
            # is the prefix cache's, read and never written)
            row += c.n
            if c.sample:
                rows.extend(range(row - 1 - len(c.draft), row))
        dev = self.device
        ctx = ForwardContext(self.kv, self._batches(chunks, spans), self.backend,
                             self.layer_hook)
        input_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        # None: every row (a decode step samples each row: no gather of all rows in order)
        logit_rows = (None if all_logits or rows == list(range(row))
                      else torch.tensor(rows, dtype=torch.int64, device=dev))
        if not mm:
            positions = torch.tensor(pos, dtype=torch.int64, device=dev)
            return input_ids, positions, ctx, logit_rows, {}
        positions = torch.cat(pos3, dim=1).to(dev)
        embeds = None
        if mm_rows:
            embeds = (torch.cat(mm_rows).to(dev), torch.cat(mm_embs).to(dev))
        return input_ids, positions, ctx, logit_rows, {"mm_embeds": embeds}

    def _batches(self, chunks: list[ScheduledChunk], spans: list) -> dict[str, Any]:
        """Each layer kind's attention batch: `AttnBatch` (slot lists and masks), or for a
        paged backend `PagedAttnMeta` (page ids); both split a verify chunk into one-query
        rows, so accepted tokens match plain decoding either way."""
        dev = self.device
        if self.backend.paged:
            cfg = getattr(self.model, "cfg", None)
            return build_paged_metadata(
                chunks, self.pool, self.window if self.has_swa else None, device=dev,
                full_sinks=bool(getattr(cfg, "full_attention_sink", False)),
                swa_sinks=bool(getattr(cfg, "swa_attention_sink", False)))
        full = [(r, a, n, kv, 0, kv.full_cached_to) for r, a, n, kv in spans]
        batches = {"full": build_attn_batch(full, None, self.pool.full_slots, dev, self.mask_dtype)}
        if self.has_swa:
            swa = [(r, a, n, kv, kv.swa_floor, 0) for r, a, n, kv in spans]
            batches["swa"] = build_attn_batch(swa, self.window, self.pool.swa_slots, dev,
                                              self.mask_dtype)
        return batches

    def swa_batch(self, spans: list[tuple[Sequence, int, int]]) -> Any:
        """The SWA kind's batch of positions [start, start + n) of each (seq, start, n), rows
        in that order, outside a scheduled step (the MTP layers' teacher-forced pass)."""
        if self.backend.paged:
            cfg = getattr(self.model, "cfg", None)
            chunks = [ScheduledChunk(s, a, n, False) for s, a, n in spans]
            return build_paged_metadata(
                chunks, self.pool, self.window, device=self.device, kinds=("swa",),
                swa_sinks=bool(getattr(cfg, "swa_attention_sink", False)))["swa"]
        rows, items = 0, []
        for s, a, n in spans:
            items.append((rows, a, n, s.running_kv, s.running_kv.swa_floor, 0))
            rows += n
        return build_attn_batch(items, self.window, self.pool.swa_slots, self.device,
                                self.mask_dtype)
