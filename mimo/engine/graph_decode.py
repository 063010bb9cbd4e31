"""The graph-ready decode step (`--decode-graphs`): a step of plain decodes runs padded to a
fixed batch size (gpu/decode_buckets.py), from static input buffers and static paged
metadata, so its shapes and tensor addresses are the same every time it runs at that size.

On CUDA, the first step at a size runs eagerly on a side stream (that is the step's result,
and it compiles the Triton kernels), then the same call is captured into a CUDA graph;
later steps at that size copy their inputs into the buffers and replay it. Inside the
captured region nothing reads back to the host and nothing is sized by data: the split
count of the decode kernel comes from the buffers' capacity, not the step's longest range,
and the kernel's scratch tensors get fixed addresses in the graphs' shared memory pool. On
CPU (or with capture off) the same padded step runs eagerly: the tests' way to check that
padding changes no token.

Only steps made entirely of single-token decodes of text requests run here (no prefill
chunk, no verify chunk, no media rows, at most the largest size); every other step takes
the runner's ordinary path. The attention backend must be paged (triton): the torch
backend's batches are shaped by each step's key lengths.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch

from ..config import ConfigError
from ..gpu.decode_buckets import StaticDecodeMeta, bucket_for, decode_buckets
from ..gpu.paged_metadata import build_paged_metadata
from ..models.context import ForwardContext

log = logging.getLogger(__name__)
MODES = ("auto", "on", "off")


def host_syncing_modules(model) -> list[str]:
    """Names of the model's modules whose forward reads device values back on the host
    (a class attribute `syncs_host`, e.g. MoE routing that loops over the chosen experts):
    such a forward cannot be captured."""
    return [n for n, m in model.named_modules() if getattr(m, "syncs_host", False)]


def resolve_decode_graphs(mode: str, device: str, paged: bool, model) -> tuple[bool, bool]:
    """(bucketed step on, capture on) for `--decode-graphs mode`; ConfigError when 'on'
    cannot be honoured. auto: on exactly where capture works (CUDA, paged backend, no host-
    syncing module), else off."""
    if mode not in MODES:
        raise ConfigError(f"decode_graphs must be auto, on or off, not {mode!r}")
    cuda = torch.device(device).type == "cuda"
    syncing = host_syncing_modules(model)
    if mode == "off" or (mode == "auto" and not (cuda and paged and not syncing)):
        return False, False
    if not paged:
        raise ConfigError("decode_graphs=on needs a paged attention backend "
                          "(attention_backend=triton): the torch backend's batches are "
                          "shaped by each step's key lengths")
    if cuda and syncing:
        raise ConfigError(f"decode_graphs=on: this model's decode cannot be captured in a "
                          f"CUDA graph ({syncing[0]} reads routing results back on the host); "
                          f"use decode_graphs=auto or off")
    return True, cuda


class BucketedDecode:
    """Padded decode steps for one runner. `max_seqs`: most decodes a step holds (the
    scheduler's max_num_seqs); `max_model_len`: the longest sequence (sizes the full
    kind's page lists)."""

    def __init__(self, runner, max_seqs: int, max_model_len: int, capture: bool,
                 strict: bool = True):
        # strict (decode_graphs=on): a failed capture raises; else (auto) the padded step
        # goes on eagerly at every size, with one warning.
        self.runner, self.capture, self.strict = runner, capture, strict
        self.buckets = decode_buckets(max_seqs)
        rows, dev, pool = self.buckets[-1], runner.device, runner.pool
        P = pool.page_size
        cfg = getattr(runner.model, "cfg", None)
        self.sinks = {"full": bool(getattr(cfg, "full_attention_sink", False)),
                      "swa": bool(getattr(cfg, "swa_attention_sink", False))}
        full_pages = -(-max_model_len // P)
        self.meta = {"full": StaticDecodeMeta("full", P, -1, self.sinks["full"], rows,
                                              full_pages, dev)}
        if runner.has_swa:
            # A decode's SWA range: from the page of its window's first key to its own.
            swa_pages = min(full_pages, -(-runner.window // P) + 1)
            self.meta["swa"] = StaticDecodeMeta("swa", P, runner.window - 1, self.sinks["swa"],
                                                rows, swa_pages, dev)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self._ctx: dict[int, ForwardContext] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._out: dict[int, torch.Tensor] = {}
        self._pool: Any = None          # the graphs' shared memory pool
        self.steps: Counter[tuple[int, int]] = Counter()   # (decodes, padded size) -> steps

    def eligible(self, chunks) -> bool:
        return 0 < len(chunks) <= self.buckets[-1] and all(
            c.n == 1 and c.sample and not c.draft and c.seq.mm is None for c in chunks)

    def run(self, chunks) -> torch.Tensor | None:
        """Final hidden states of the step's rows ([n, hidden], a view into a buffer that the
        next step at this size overwrites), or None when the step must take the ordinary
        path."""
        if not self.eligible(chunks):
            return None
        n = len(chunks)
        rows = bucket_for(n, self.buckets)
        assert rows is not None
        r = self.runner
        host = build_paged_metadata(chunks, r.pool, r.window if r.has_swa else None,
                                    device="cpu", full_sinks=self.sinks["full"],
                                    swa_sinks=self.sinks["swa"])
        if not all(self.meta[k].fill(m, rows) for k, m in host.items()):
            return None
        ids = [c.seq.all_ids[c.start] for c in chunks]
        pos = [c.start for c in chunks]
        ids += [ids[0]] * (rows - n)        # padding rows repeat row 0 (decode_buckets.py)
        pos += [pos[0]] * (rows - n)
        self.input_ids[:rows].copy_(torch.tensor(ids), non_blocking=True)
        self.positions[:rows].copy_(torch.tensor(pos), non_blocking=True)
        self.steps[(n, rows)] += 1
        if not self.capture:
            return self._forward(rows)[:n]
        graph = self._graphs.get(rows)
        if graph is None:
            return self._capture(rows)[:n]
        graph.replay()
        return self._out[rows][:n]

    def _forward(self, rows: int) -> torch.Tensor:
        if rows not in self._ctx:
            r = self.runner
            batches: dict[str, Any] = {k: m.view(rows) for k, m in self.meta.items()}
            self._ctx[rows] = ForwardContext(r.kv, batches, r.backend)
        return self.runner.model(self.input_ids[:rows], self.positions[:rows], self._ctx[rows])

    def _capture(self, rows: int) -> torch.Tensor:
        """Run the step eagerly on a side stream (its result, and every kernel compiled),
        then capture the same call. Capture records and does not execute: the KV the eager
        run wrote is written once."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self._forward(rows)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                self._out[rows] = self._forward(rows)
        except RuntimeError as e:
            if self.strict:
                raise
            log.warning("capturing the decode step failed (%s); decoding without CUDA "
                        "graphs from now on", e)
            self.capture = False
            return out
        self._pool = graph.pool()
        self._graphs[rows] = graph
        log.info("captured the decode step at batch size %d", rows)
        return out
