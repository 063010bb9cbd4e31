"""What every decoder-only family shares: the pre-norm layer (Llama's shape) and the
embed -> layers -> final norm loop with its LM head (`DecoderLM`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..gpu.attention import AttentionBackend, AttnBatch
from . import fused_decode
from .attention import Attention
from .context import ForwardContext
from .layers import QUANT_MAX_ROWS, Linear, LlamaRMSNorm, Rotary, quantize_int8
from .lm_head import LMHead
from .mlp import GatedMLP
from .untraced import arm


class PreNormLayer(nn.Module):
    """x + attn(input_norm(x)), then x + mlp(post_attn_norm(x)): HF names the second norm
    `post_attention_layernorm` although it runs before the MLP."""

    def __init__(self, attn: Attention, mlp: nn.Module, input_norm: nn.Module,
                 post_attn_norm: nn.Module):
        super().__init__()
        self.kind = attn.kind
        self.attn, self.mlp = attn, mlp
        self.input_norm, self.post_attn_norm = input_norm, post_attn_norm

    @classmethod
    def load(cls, cfg: ModelConfig, i: int, w: dict, dtype: torch.dtype,
             mlp: nn.Module | None = None) -> PreNormLayer:
        """Layer `i` from HF weights (`model.layers.{i}.*`), norms scaled by w; `mlp`: the
        layer's feed-forward block if not the dense SiLU one (MoE)."""
        p = f"model.layers.{i}."
        eps, H = cfg.rms_norm_eps, cfg.hidden_size
        return cls(Attention(cfg, cfg.layer_types[i], w, p + "self_attn.", dtype),
                   mlp or GatedMLP.load(w, p + "mlp.", dtype),
                   LlamaRMSNorm(H, eps, w[p + "input_layernorm.weight"], dtype),
                   LlamaRMSNorm(H, eps, w[p + "post_attention_layernorm.weight"], dtype))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttnBatch,
                backend: AttentionBackend) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), rope, k_cache, v_cache, batch, backend)
        return x + self.mlp(self.post_attn_norm(x))


class DecoderLayer(Protocol):
    """What `DecoderLM.forward` needs of a layer (PreNormLayer, Gemma3Layer)."""
    kind: str

    def __call__(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                 k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttnBatch,
                 backend: AttentionBackend) -> torch.Tensor: ...


class DecoderLM(nn.Module):
    """A decoder-only LM over the paged KV cache. A family's subclass sets `rope` (layer kind
    -> rotary module with `tables(positions)`), `embed`, `layers` (each with a `kind` and the
    `PreNormLayer.forward` signature), `norm` and `lm_head`; `embed_tokens` may scale."""

    rope: nn.ModuleDict
    embed: nn.Parameter
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: LMHead

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Set by `compile_layers`: each layer's compiled forward, used for steps of more
        # than `_compiled_above` tokens (smaller steps run eagerly).
        self._compiled: list | None = None
        self._compiled_above = 0
        # Set by `fuse_decode`: per layer its C++ decode layer, or None where the plain
        # layer runs (fused_decode.py); used for the steps `fused_decode.step_fits`.
        self._fused: list | None = None

    def compile_layers(self, above: int = 0) -> None:
        """Run each layer through `torch.compile` (inductor) for steps of more than `above`
        tokens. Fusing the norms, RoPE, activations and residual adds removes most of a
        prefill step's elementwise passes over memory. The paged attention call stays
        eager (`attention.paged_attention` is excluded from tracing), so every layer is two
        graphs around it; all layers of a model share their compiled code (their weights
        are graph inputs), and shapes are dynamic in the token count (no recompile per
        chunk size)."""
        arm()
        self._compiled = [torch.compile(layer.forward, dynamic=True) for layer in self.layers]
        self._compiled_above = above

    def fuse_decode(self, ops) -> int:
        """Give each layer that `fused_decode.fuse_layer` accepts its C++ decode layer
        (`ops`: mimo.cpu.decode_ops.load()); returns how many. Call after the blocks are
        attached (the fused layers keep references to them)."""
        ropes = cast("Mapping[str, Rotary]", self.rope)
        layers = cast("Sequence[DecoderLayer]", self.layers)
        fused = [fused_decode.fuse_layer(ops, layer, ropes[layer.kind]) for layer in layers]
        n = sum(f is not None for f in fused)
        self._fused = fused if n else None
        return n

    def unfuse_decode(self) -> None:
        self._fused = None

    def fused_rows(self) -> int:
        """The most rows a step may have for the fused decode layers to run it (0: none are
        fused); `fused_decode.step_fits` says whether a given step does."""
        return QUANT_MAX_ROWS if self._fused is not None else 0

    def _head(self, w: dict, dtype: torch.dtype, required: bool = True) -> LMHead:
        """The tied embedding, else `lm_head.weight`; an untied checkpoint without one is
        refused if `required`, else tied after all (Gemma's choice)."""
        if self.cfg.tie_word_embeddings:
            head, source = self.embed, "model.embed_tokens.weight"
        elif "lm_head.weight" in w:
            head, source = w["lm_head.weight"].to(dtype), "lm_head.weight"
        elif required:
            raise ValueError(f"untied {self.cfg.arch} checkpoint has no lm_head.weight")
        else:
            head, source = self.embed, "model.embed_tokens.weight"
        return LMHead(Linear(head, (source,)))

    def quantize_int8(self) -> None:
        quantize_int8(self)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                logit_rows: torch.Tensor | None = None,
                mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Flattened tokens of every scheduled sequence -> final hidden states of
        `logit_rows` (all rows if None), ready for `lm_head.logits` or `lm_head.greedy`.
        `positions`: whatever the rotary modules take ([T]; [3, T] for M-RoPE);
        `mm_embeds=(rows [M], embeddings [M, hidden])` put in place of those rows' token
        embeddings (vision embeddings where placeholder tokens sit)."""
        # The residual stream is float32 whatever the runtime dtype: blocks read it through
        # their norms and write bf16 outputs into it, so rounding does not build up over
        # the layers (bf16 residuals drifted by ~0.15 logits on Gemma 3 270M, enough to flip
        # greedy tokens the float32 reference is sure of). Matmuls and KV stay in the dtype.
        x = self.embed_tokens(input_ids).float()
        if mm_embeds is not None:
            rows, emb = mm_embeds
            x = x.index_copy(0, rows, emb.to(x.dtype))
        # torch's ModuleDict and ModuleList are not generic: their element types are stated here.
        ropes = cast("Mapping[str, Rotary]", self.rope)
        layers = cast("Sequence[DecoderLayer]", self.layers)
        tables = {kind: rope.tables(positions) for kind, rope in ropes.items()}
        compiled = self._compiled if x.shape[0] > self._compiled_above else None
        fused = self._fused
        if fused is not None and not fused_decode.step_fits(x, ctx.batches, ctx.backend):
            fused = None
        if fused is not None:
            ftables = fused_decode.float_tables(tables)
        for i, layer in enumerate(layers):
            k_cache, v_cache = ctx.kv[i]
            if fused is not None and fused[i] is not None:
                x = fused_decode.run(fused[i], x, ftables[layer.kind], k_cache, v_cache,
                                     ctx.batches[layer.kind])
            else:
                run = layer if compiled is None else compiled[i]
                x = run(x, tables[layer.kind], k_cache, v_cache, ctx.batches[layer.kind],
                        ctx.backend)
            if ctx.after_layer is not None:
                ctx.after_layer(i)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return self.norm(x)
