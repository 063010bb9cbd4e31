"""What a model's forward needs besides tokens: per-layer cache tensors, the step's attention
batches per layer kind, and the attention backend. Built by the engine's runner, the only
place that turns scheduled requests into tensors."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..gpu.attention import AttentionBackend, AttnBatch


@dataclass
class ForwardContext:
    kv: list[tuple[torch.Tensor, torch.Tensor]]   # per layer: (k_cache, v_cache)
    batches: dict[str, AttnBatch]                 # 'full' / 'swa'
    backend: AttentionBackend
    # Called with i after decoder layer i has run (its KV written), on the forward's thread;
    # the engine sets it only for steps whose KV it hands over layer by layer.
    after_layer: Callable[[int], None] | None = None
