"""Shared fixtures: tiny random-weight models built in code, and the real default model.

Every test that imports transformers does so offline (HF_HUB_OFFLINE=1, set here first).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
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


@pytest.fixture(scope="session")
def tiny_gemma3():
    return tiny_gemma3_hf()


@pytest.fixture(scope="session")
def gemma_loaded():
    """The real default model's weights and tokenizer, loaded once per session."""
    from mimo.models import registry
    return registry.load("gemma-3-270m", progress=False)


@pytest.fixture(scope="session")
def gemma_fp32(gemma_loaded):
    """The real default model in float32 (reference-exact numerics)."""
    from mimo import LLM
    return LLM("gemma-3-270m", progress=False, loaded=gemma_loaded, dtype="float32",
               kv_cache_memory="256MiB")


@pytest.fixture(autouse=True)
def _pools_balanced(request):
    """After every test that used the shared real model: its pools balance and are empty."""
    yield
    if "gemma_fp32" in request.fixturenames:
        eng = request.getfixturevalue("gemma_fp32").engine
        eng.check_integrity()


def long_prompt_ids(tok, n: int) -> list[int]:
    """Exactly n tokens of real prose (the stdlib's own documentation), BOS first."""
    import argparse
    import inspect
    import json
    text = "\n\n".join(inspect.getdoc(m) or "" for m in (argparse, json, inspect))
    ids = tok.encode(text)
    assert len(ids) >= n, "not enough text for the requested prompt length"
    return ids[:n]


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory):
    """A complete tiny Hugging Face checkpoint on disk: config.json, safetensors, and a small
    BPE tokenizer.json trained here. Returns (directory, the transformers model)."""
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    d = tmp_path_factory.mktemp("tiny_gemma3")
    model = tiny_gemma3_hf(seed=11)
    model.save_pretrained(d, safe_serialization=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog"] * 50 + ["hello world, hello mimo"] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True}))
    return d, model
