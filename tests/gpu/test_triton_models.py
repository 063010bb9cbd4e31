"""Whole models through the Triton backend (interpreted on CPU, float32) against the torch
backend: a tiny Gemma 3 (window 8, 5 SWA + 1 full layer) and a tiny MiMo-V2-Flash (window 6,
SWA sinks, q/k dim 24 / v 16, GQA, 2 MTP layers) generate the same greedy tokens, with the
prefix cache on (a second wave of prompts shares the first one's prefix and hits it) and
batches that mix prefill chunks with decodes; MiMo through Triton with MTP speculation on
(verify chunks), against torch without it.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.mtp_reference import mtp_weights
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf, tiny_mimo_v2_flash_hf

from mimo import LLM, SamplingParams
from mimo.models.hf_config import model_config_from_hf
from mimo.models.registry import LoadedModel

OPTS = dict(dtype="float32", kv_cache_memory="4MiB", page_size=4, max_num_batched_tokens=12,
            progress=False)


def _prompts(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, vocab, (13,), generator=g).tolist()
    tail = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (3, 6)]
    return [shared + [5]], [shared + t for t in tail]


def _generate(loaded, backend, waves, max_tokens=4, device="cpu", **opts):
    """Greedy outputs of each wave (run to completion, one step at a time, pools checked),
    and the prompt tokens each request found cached. `device`: the fixture's (CUDA when the
    kernels are compiled, on a GPU machine)."""
    llm = LLM("tiny", loaded=loaded, attention_backend=backend, device=device,
              **(OPTS | opts))
    eng = llm.engine
    assert eng.runner.backend.paged == (backend == "triton")
    outs, cached = [], []
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for wave in waves:
        seqs = [eng.add_request(p, params) for p in wave]
        while eng.has_work():
            eng.step()
            eng.check_integrity()
        outs += [s.output_ids for s in seqs]
        cached += [s.cached_tokens for s in seqs]
    return outs, cached


def test_triton_tiny_gemma3_greedy_matches_torch(triton_device):
    loaded = loaded_from_hf(tiny_gemma3_hf())
    waves = _prompts(0, 512)
    want, cached_t = _generate(loaded, "torch", waves, device=triton_device)
    got, cached = _generate(loaded, "triton", waves, device=triton_device)
    assert got == want
    assert cached == cached_t and min(cached[1:]) >= 12, "the second wave must hit the cache"


@pytest.fixture(scope="module")
def mimo_loaded():
    hf = tiny_mimo_v2_flash_hf()
    w = {k: v.detach().clone() for k, v in hf.state_dict().items()} | mtp_weights(hf, 2)
    cfg = dataclasses.replace(model_config_from_hf(hf.config.to_dict()), num_mtp_layers=2)
    return LoadedModel(cfg, w, None, "tiny")


def test_triton_tiny_mimo_greedy_matches_torch(mimo_loaded, triton_device):
    """Through Triton with MTP speculation on (drafts verified as one-query rows, the MTP
    layers' own pass on the paged metadata too): the torch backend's tokens without it."""
    cfg = mimo_loaded.config
    assert cfg.swa_attention_sink and cfg.head_dim != cfg.v_head_dim
    waves = _prompts(1, 300)
    want, cached_t = _generate(mimo_loaded, "torch", waves, device=triton_device)
    got, cached = _generate(mimo_loaded, "triton", waves, device=triton_device,
                            speculative="mtp", num_draft_tokens=2)
    assert got == want
    assert min(cached[1:]) >= 12, "the second wave must hit the cache"
