"""Builders shared by the tests (a plain module: test files import it by this unique name;
`conftest` is ambiguous once a subfolder has its own conftest.py)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from mimo.models.hf_config import model_config_from_hf
from mimo.models.registry import LoadedModel


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
    model = Gemma3ForCausalLM(cfg).float().eval()
    with torch.no_grad():   # non-trivial norms, so a wrong (1 + w) convention shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.08)
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
