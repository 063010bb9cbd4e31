"""Shared fixtures: tiny random-weight models built in code, and the real default model.

Every test that imports transformers does so offline (HF_HUB_OFFLINE=1, set here first).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
from helpers.tiny_models import loaded_from_hf, long_prompt_ids, tiny_gemma3_hf  # noqa: F401
from hypothesis import settings

# CI (CI set, as .ci/run does) replays the same examples every run, so a landing's verdict
# does not depend on the draw; local runs draw new ones and may find a new falsifying case.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


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
    """The real default model in float32 with dense weights (reference-exact numerics)."""
    from mimo import LLM
    return LLM("gemma-3-270m", progress=False, loaded=gemma_loaded, dtype="float32",
               quantize="none", kv_cache_memory="256MiB")


@pytest.fixture(autouse=True)
def _pools_balanced(request):
    """After every test that used the shared real model: its pools balance and are empty."""
    yield
    if "gemma_fp32" in request.fixturenames:
        eng = request.getfixturevalue("gemma_fp32").engine
        eng.check_integrity()


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
