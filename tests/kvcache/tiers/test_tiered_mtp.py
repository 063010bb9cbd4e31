"""MTP drafting after a tier hit (tiny MiMo-V2-Flash with 2 MTP layers, float32): the MTP
layers' KV lives with the SWA KV, so an L3 hit brings back their window too, and the
drafts, hence the acceptance counts, equal those after an L1 hit, token for token."""
from __future__ import annotations

import dataclasses

import torch
from helpers.mtp_reference import mtp_weights
from helpers.tiny_models import tiny_mimo_v2_flash_hf

from mimo import LLM, SamplingParams
from mimo.models.hf_config import model_config_from_hf
from mimo.models.registry import LoadedModel

# N - 1 a page multiple: both hits are every prompt token but the last, whole pages only
# (L1 would also copy a partial page's rows, the tiers hold whole pages: radix/tails.py).
K, PAGE, N = 2, 4, 905
OPTS = dict(dtype="float32", kv_cache_memory="16MiB", page_size=PAGE, progress=False,
            speculative="mtp", num_draft_tokens=K, max_num_batched_tokens=256)
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _loaded() -> LoadedModel:
    hf = tiny_mimo_v2_flash_hf()
    w = {k: v.detach().clone() for k, v in hf.state_dict().items()} | mtp_weights(hf, K)
    # Every logit 0 but two opposite ones (as tests/spec/test_mtp.py): target and MTP layers
    # answer 7 or 9, so drafts are often accepted, and which one depends on the KV read.
    v = w["lm_head.weight"][7].clone()
    w["lm_head.weight"] = torch.zeros_like(w["lm_head.weight"])
    w["lm_head.weight"][7], w["lm_head.weight"][9] = v, -v
    cfg = dataclasses.replace(model_config_from_hf(hf.config.to_dict()), num_mtp_layers=K)
    return LoadedModel(cfg, w, None, "tiny")


def test_acceptance_after_an_l3_hit_equals_after_an_l1_hit(tmp_path):
    loaded = _loaded()
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 300, (N,), generator=g).tolist()
    store = f"file:{tmp_path}"
    first = LLM("tiny", loaded=loaded, kv_storage=store, **OPTS)
    cold = first.generate({"prompt_token_ids": prompt}, GREEDY)[0]
    l1 = first.generate({"prompt_token_ids": prompt}, GREEDY)[0]
    assert l1.cached_tokens == N - 1
    assert first.engine.flush_tiers()
    first.engine.close()
    second = LLM("tiny", loaded=loaded, kv_storage=store, **OPTS)
    l3 = second.generate({"prompt_token_ids": prompt}, GREEDY)[0]
    second.engine.check_integrity()
    assert second.engine.cache.l3.hit_tokens == l3.cached_tokens == l1.cached_tokens
    assert second.engine.cache.l3.pages_read["s"] > 0        # the SWA + MTP window
    assert l3.token_ids == l1.token_ids == cold.token_ids
    assert l3.spec_stats == l1.spec_stats
    assert l1.spec_stats["accepted_tokens"] > 0
    second.engine.close()
