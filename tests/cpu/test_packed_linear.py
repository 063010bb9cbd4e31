"""Short steps on oneDNN-packed weights (Linear.pack, engine/prefill_matmul.pack_short_steps):
the packed product equals the plain one and a float64 reference, steps of more than
PACKED_MAX_ROWS rows keep torch's GEMM, and only 'auto' in bfloat16 on an AMX CPU packs
(never the LM head). Dense bf16 products run at a bounded set of row counts (`gemm_rows`),
with the rows asked for equal to a float64 reference."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM
from mimo.config import RuntimeConfig
from mimo.engine import prefill_matmul
from mimo.models import layers
from mimo.models.layers import PACKED_MAX_ROWS, QUANT_MAX_ROWS, Linear
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


def test_dense_products_run_at_a_bounded_set_of_row_counts(monkeypatch):
    """Every step size from 1 to a 1,536-token chunk: torch's GEMM sees at most 28 row
    counts above QUANT_MAX_ROWS (each a kernel oneDNN builds once), never fewer rows than
    asked, fewer than 32 more up to 512 rows, 64 to 1,024, 128 beyond (so at most 1/8 more
    from 256 rows on), and the rows asked for are the product's."""
    seen: list[int] = []
    plain = F.linear

    def recording(x, w):
        seen.append(x.shape[0])
        return plain(x, w)
    monkeypatch.setattr(layers.F, "linear", recording)
    lin = _linear(n_out=48, n_in=40)
    g = torch.Generator().manual_seed(3)
    x_all = torch.randn(1536, 40, generator=g).bfloat16()
    ref_all = x_all.double() @ lin.weight.double().T
    for rows in range(1, 1537):
        y = lin(x_all[:rows])
        assert y.shape == (rows, 48)
        torch.testing.assert_close(y.double(), ref_all[:rows], atol=0.05, rtol=2e-2)
        ran = seen[-1]
        if rows <= QUANT_MAX_ROWS:
            assert ran == rows
        else:
            step = 32 if rows <= 512 else 64 if rows <= 1024 else 128
            assert rows <= ran < rows + step
            assert rows < 256 or ran <= rows * 9 // 8
    assert len({r for r in seen if r > QUANT_MAX_ROWS}) <= 28


def test_padded_rows_do_not_reach_the_answer():
    """Rows past the asked ones are zeros, whatever the input buffer holds beyond them
    (a view into a larger tensor, non-finite values after it), leading dims kept."""
    lin = _linear()
    buf = torch.randn(2, 40, 80).bfloat16()
    buf[:, 33:] = float("nan")
    x = buf[:, :33]                                     # 66 rows, padded to 96
    y = lin(x)
    assert y.shape == (2, 33, 96) and bool(torch.isfinite(y).all())
    torch.testing.assert_close(y.double(), x.double() @ lin.weight.double().T,
                               atol=0.1, rtol=2e-2)
    assert lin(buf[:, :0]).shape == (2, 0, 96)          # no rows: an empty answer


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
