"""Short steps on oneDNN-packed weights (Linear.pack, engine/prefill_matmul.pack_short_steps):
the packed product equals the plain one and a float64 reference, steps of more than
PACKED_MAX_ROWS rows keep torch's GEMM, and only 'auto' in bfloat16 on an AMX CPU packs
(never the LM head)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM
from mimo.config import RuntimeConfig
from mimo.engine import prefill_matmul
from mimo.models.layers import PACKED_MAX_ROWS, Linear
from mimo.models.lm_head import LMHead

AMX = frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})


def _linear(n_out=96, n_in=80, seed=0) -> Linear:
    g = torch.Generator().manual_seed(seed)
    return Linear(torch.randn(n_out, n_in, generator=g).bfloat16())


@pytest.mark.parametrize("rows", [1, 3, 17, PACKED_MAX_ROWS])
def test_packed_product_equals_the_plain_one(rows):
    lin = _linear()
    x = torch.randn(1, rows, 80).bfloat16()          # leading dims are kept
    plain = F.linear(x, lin.weight)
    lin.pack()
    y = lin(x)
    assert y.shape == (1, rows, 96) and y.dtype == torch.bfloat16
    ref = x.double() @ lin.weight.double().T
    torch.testing.assert_close(y.double(), ref, atol=0.1, rtol=2e-2)
    torch.testing.assert_close(y, plain, atol=0, rtol=0)


def test_only_short_steps_take_the_packed_weight():
    """A packed copy of another weight shows which rows use it: up to PACKED_MAX_ROWS."""
    lin, other = _linear(seed=0), _linear(seed=1)
    other.pack()
    lin.w_packed = other.w_packed
    for rows, w in ((1, other.weight), (PACKED_MAX_ROWS, other.weight),
                    (PACKED_MAX_ROWS + 1, lin.weight)):
        x = torch.randn(rows, 80).bfloat16()
        torch.testing.assert_close(lin(x).double(), x.double() @ w.double().T,
                                   atol=0.1, rtol=2e-2)


def _llm(**opts) -> LLM:
    return LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf(seed=2)), kv_cache_memory="2MiB",
               page_size=4, progress=False, **opts)


def _unpack(model) -> None:
    """Undo what 'auto' did at load on an AMX CPU."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.w_packed = None


def test_the_rule():
    llm = _llm(dtype="bfloat16", quantize="none")
    model = llm.engine.model
    _unpack(model)
    rt = RuntimeConfig(dtype="bfloat16", quantize="none")
    dense = prefill_matmul.PrefillMatmul("dense", "test")
    no_amx = AMX - {"amx_bf16"}
    assert prefill_matmul.pack_short_steps(model, rt, dense, no_amx) == 0
    for other in (dataclasses.replace(rt, dtype="float32"),
                  dataclasses.replace(rt, prefill_matmul="dense"),
                  dataclasses.replace(rt, compile="on")):
        assert prefill_matmul.pack_short_steps(model, other, dense, AMX) == 0
    assert prefill_matmul.pack_short_steps(
        model, rt, prefill_matmul.PrefillMatmul("blocks", "test"), AMX) == 0
    assert not any(m.w_packed is not None for m in model.modules() if isinstance(m, Linear))
    n = prefill_matmul.pack_short_steps(model, rt, dense, AMX)
    head = {id(m) for h in model.modules() if isinstance(h, LMHead) for m in h.modules()}
    lins = [m for m in model.modules() if isinstance(m, Linear)]
    assert n == sum(id(m) not in head for m in lins) > 0
    assert all((m.w_packed is None) == (id(m) in head) for m in lins)


def test_packed_engine_gives_the_plain_engines_tokens():
    """The same greedy tokens and logprobs with and without the packed weights (a tiny
    bfloat16 model, prompts short enough to take them)."""
    from mimo import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=6, logprobs=2)
    prompts = [{"prompt_token_ids": [2, 5, 9, 14, 3, 7, 11] * k} for k in (1, 3, 9)]
    plain = _llm(dtype="bfloat16", quantize="none")
    _unpack(plain.engine.model)
    packed = _llm(dtype="bfloat16", quantize="none")
    _unpack(packed.engine.model)
    rt = RuntimeConfig(dtype="bfloat16", quantize="none")
    assert prefill_matmul.pack_short_steps(packed.engine.model, rt,
                                           prefill_matmul.PrefillMatmul("dense", "t"), AMX)
    a = plain.generate(prompts, sp)
    b = packed.generate(prompts, sp)
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert [t.logprob for t in x.logprobs] == [t.logprob for t in y.logprobs]
