"""Tiny models run through the CPU kernels (--quantize q8_0): every linear, MoE experts
included, gets Q8_0 blocks, and greedy decoding equals transformers' on the same Q8_0
weights (the reference's linears rounded to Q8_0 and back), up to its first step whose
top-2 margin is below 0.1 (the decode steps also quantize activations to 8 bits)."""
import copy

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf, tiny_mimo_v2_flash_hf

from mimo import LLM, SamplingParams
from mimo.models.quantized import q8_0_blocks, q8_0_values

MARGIN = 0.1
STEPS = 12


def _rounded(model):
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.Linear) and m.weight.shape[1] % 32 == 0:
                m.weight.copy_(q8_0_values(q8_0_blocks(m.weight)))
            elif type(m).__name__.endswith("Experts"):   # transformers' fused expert weights
                for p in m.parameters(recurse=False):
                    if p.dim() == 3 and p.shape[-1] % 32 == 0:
                        p.copy_(torch.stack([q8_0_values(q8_0_blocks(e)) for e in p]))
    return ref


def _reference(model, ids):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0)
    margins = [float(torch.topk(lg[0], 2).values.diff().abs()) for lg in out.logits]
    return out.sequences[0, len(ids):].tolist(), margins


@pytest.mark.parametrize("family", ["mimo_v2_flash", "gemma3"])
def test_q8_0_greedy_matches_transformers(family):
    hf = (tiny_mimo_v2_flash_hf if family == "mimo_v2_flash" else tiny_gemma3_hf)(seed=3)
    llm = LLM("tiny", loaded=loaded_from_hf(hf), dtype="float32", quantize="q8_0",
              kv_cache_memory="2MiB", page_size=4, progress=False)
    w = llm.engine.weights
    assert w.format == "q8_0" and w.report.dense == 0 and w.report.quantized > 0
    ref = _rounded(hf)
    vocab = hf.config.vocab_size
    gen = torch.Generator().manual_seed(5)
    compared = 0
    for n in (5, 13, 21):
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        out = llm.generate({"prompt_token_ids": ids},
                           SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))[0]
        want, margins = _reference(ref, ids)
        k = next((i for i, m in enumerate(margins) if m < MARGIN), STEPS)
        assert out.token_ids[:k] == want[:k], (n, out.token_ids, want, k)
        compared += k
    assert compared >= STEPS, f"only {compared} decisive steps compared"
    llm.engine.check_integrity()
