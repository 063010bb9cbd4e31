"""Tiny random models from transformers, the LoadedModel built from one, seeded prompts."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from mimo.models.hf_config import model_config_from_hf
from mimo.models.registry import LoadedModel


def randomize_(model, norm_mean: float, norm_std: float, sinks_std: float | None = None):
    """Draw every weight again, in parameter order: norms from N(norm_mean, norm_std) (far from
    the trained values, so a wrong norm convention shows), attention sinks from N(0, sinks_std)
    when given, the rest from N(0, 0.08)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(norm_mean, norm_std)
            elif sinks_std is not None and "sinks" in name:
                p.normal_(0.0, sinks_std)
            else:
                p.normal_(0.0, 0.08)
    return model


def random_prompts(seed: int, lengths, vocab: int = 512) -> list[list[int]]:
    """Token-id prompts of the given lengths, ids in [3, vocab), from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in lengths]


def tiny_gemma3_hf(seed: int = 0, **overrides):
    """A random Gemma 3 text model from transformers (float32): 6 layers, 5 SWA + 1 full."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    kw = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
              max_position_embeddings=4096, query_pre_attn_scalar=16, rope_theta=1_000_000.0,
              rope_local_base_freq=10_000.0, attn_implementation="eager",
              bos_token_id=2, eos_token_id=1, pad_token_id=0)
    kw.update(overrides)
    cfg = Gemma3TextConfig(**kw)
    torch.manual_seed(seed)
    # Non-trivial norms, so a wrong (1 + w) convention shows.
    return randomize_(Gemma3ForCausalLM(cfg).float().eval(), 0.0, 0.3)


def tiny_mimo_v2_flash_hf(seed: int = 0, **overrides):
    """A random MiMo-V2-Flash from transformers (float32): 5 layers (full, swa, swa, full, swa),
    a dense first layer then MoE (8 experts in 2 groups, top-2 from the best group), q/k head
    dim 24 / v 16, partial RoPE with a different factor per kind, window 6 previous tokens +
    the query. transformers ties SWA KV heads to twice the full ones (1 -> 2)."""
    from transformers import MiMoV2FlashConfig, MiMoV2FlashForCausalLM
    kw = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
              num_attention_heads=4, num_key_value_heads=1, head_dim=24, v_head_dim=16,
              layer_types=["full_attention", "sliding_attention", "sliding_attention",
                           "full_attention", "sliding_attention"],
              rope_parameters={
                  "full_attention": {"rope_type": "default", "rope_theta": 5e6,
                                     "partial_rotary_factor": 0.334},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                        "partial_rotary_factor": 0.5}},
              moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
              topk_group=1, routed_scaling_factor=2.5, sliding_window_size=6,
              max_position_embeddings=1024, attn_implementation="eager",
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(overrides)
    cfg = MiMoV2FlashConfig(**kw)
    torch.manual_seed(seed)
    # Norms around 1 (x * w convention), sinks large enough to matter.
    model = randomize_(MiMoV2FlashForCausalLM(cfg).float().eval(), 1.0, 0.3, sinks_std=1.0)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.normal_(0.0, 0.1)
    return model


def loaded_from_hf(model) -> LoadedModel:
    cfg = model_config_from_hf(model.config.to_dict())
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return LoadedModel(cfg, weights, None, "tiny")


def long_prompt_ids(tok, n: int) -> list[int]:
    """Exactly n tokens of real prose (the stdlib's own documentation), BOS first."""
    import argparse
    import inspect
    import json
    text = "\n\n".join(inspect.getdoc(m) or "" for m in (argparse, json, inspect))
    ids = tok.encode(text)
    assert len(ids) >= n, "not enough text for the requested prompt length"
    return ids[:n]
