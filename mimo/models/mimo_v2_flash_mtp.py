"""One MiMo-V2-Flash multi-token-prediction (MTP) layer, as the hub checkpoint stores it under
`model.mtp.layers.{k}.` (transformers 5.24 ignores these weights; SGLang's
mimo_v2_flash_nextn.py and vLLM's mimo_v2_flash_mtp.py are the references):

    x   = eh_proj([enorm(embed(token)), hnorm(hidden_prev)])        # [2H] -> [H]
    x   = x + attn(input_layernorm(x))                              # SWA attention
    x   = x + mlp(pre_mlp_layernorm(x))                             # dense SiLU MLP
    out = final_layernorm(x)

The attention has the SWA layers' shape: their KV heads and head dims, their RoPE base and
partial rotary dims, their window, and a sink logit per head when SWA layers have one.
`pre_mlp_layernorm` is also accepted as `post_attention_layernorm` (the name both references
load it under).

Where the references differ: vLLM multiplies the MTP attention's values by
`attention_value_scale` (0.707) like every other layer; SGLang's nextn layer passes no value
scale. We follow vLLM (MTP_VALUE_SCALE): the MTP block is built from the same attention
module as the decoder's SWA layers, whose values are scaled in both references.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from ..config import ModelConfig
from .attention import Attention
from .decoder import PreNormLayer
from .layers import Linear, LlamaRMSNorm
from .mlp import GatedMLP

MTP_VALUE_SCALE = True

_MTP_RE = re.compile(r"^model\.mtp\.layers\.(\d+)\.")


def mtp_layers_in(weights: dict[str, torch.Tensor]) -> int:
    """How many MTP layers a checkpoint holds (`model.mtp.layers.{k}.*`, k = 0, 1, ...):
    the weights decide, as configs do not always declare them."""
    ks = {int(m.group(1)) for name in weights if (m := _MTP_RE.match(name))}
    n = 0
    while n in ks:
        n += 1
    return n


class MiMoMTPLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, k: int, w: dict, dtype: torch.dtype):
        super().__init__()
        p = f"model.mtp.layers.{k}."
        eps, H = cfg.rms_norm_eps, cfg.hidden_size

        def norm(*names):
            for n in names:
                if p + n + ".weight" in w:
                    return LlamaRMSNorm(H, eps, w[p + n + ".weight"], dtype)
            raise KeyError(f"missing {p}{names[0]}.weight")

        self.enorm, self.hnorm = norm("enorm"), norm("hnorm")
        self.eh_proj = Linear(w[p + "eh_proj.weight"].to(dtype))
        # The decoder layer's body, on the SWA kind.
        self.block = PreNormLayer(
            Attention(cfg, "swa", w, p + "self_attn.", dtype,
                      value_scale=None if MTP_VALUE_SCALE else 1.0),
            GatedMLP.load(w, p + "mlp.", dtype), norm("input_layernorm"),
            norm("pre_mlp_layernorm", "post_attention_layernorm"))
        self.final_norm = norm("final_layernorm")

    def forward(self, emb, hidden_prev, rope, k_cache, v_cache, batch, backend):
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden_prev)], dim=-1))
        return self.final_norm(self.block(x, rope, k_cache, v_cache, batch, backend))
