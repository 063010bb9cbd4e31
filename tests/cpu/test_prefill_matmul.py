"""Which weights prefill-sized steps use (engine/prefill_matmul.py): the option is honoured
or refused, the rule behind 'auto', and a Linear's product over more than QUANT_MAX_ROWS
rows going to its blocks exactly when the choice says so."""
from __future__ import annotations

import argparse

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM
from mimo.config import ConfigError, RuntimeConfig
from mimo.cpu.qmatrix import QuantMatrix
from mimo.engine import prefill_matmul
from mimo.flags import add_engine_flags
from mimo.models.layers import QUANT_MAX_ROWS, Linear


def test_unknown_or_conflicting_values_are_refused():
    with pytest.raises(ConfigError, match="prefill_matmul must be one of"):
        RuntimeConfig(prefill_matmul="int8")
    with pytest.raises(ConfigError, match="compile=on"):
        RuntimeConfig(prefill_matmul="blocks", compile="on")
    p = argparse.ArgumentParser()
    add_engine_flags(p)
    assert p.parse_args([]).prefill_matmul == "auto"
    assert p.parse_args(["--prefill-matmul", "blocks"]).prefill_matmul == "blocks"
    with pytest.raises(SystemExit):
        p.parse_args(["--prefill-matmul", "fast"])


def _llm(**opts) -> LLM:
    return LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf(seed=2)), dtype="float32",
               kv_cache_memory="2MiB", page_size=4, progress=False, **opts)


def test_blocks_need_blocks():
    with pytest.raises(ConfigError, match="needs gguf or q8_0 weights"):
        _llm(quantize="none", prefill_matmul="blocks")


@pytest.mark.parametrize("mode", ["dense", "blocks"])
def test_prefill_rows_go_where_the_choice_says(mode, monkeypatch):
    llm = _llm(quantize="q8_0", prefill_matmul=mode)
    assert llm.engine.weights.prefill == mode
    lins = [m for m in llm.engine.model.modules() if isinstance(m, Linear) and m.qweight is not None]
    assert lins and all(m.prefill_blocks == (mode == "blocks") for m in lins)
    rows: list[int] = []
    real = QuantMatrix.matmul

    def counted(self, x):
        rows.append(x.numel() // x.shape[-1])
        return real(self, x)
    monkeypatch.setattr(QuantMatrix, "matmul", counted)
    lin = lins[0]
    x = torch.randn(QUANT_MAX_ROWS + 9, lin.weight.shape[1])
    y = lin(x)
    assert rows == ([QUANT_MAX_ROWS + 9] if mode == "blocks" else [])
    # What the input is cast to, said ahead (a norm writes it so): blocks take it as is.
    assert lin.input_dtype(QUANT_MAX_ROWS) is None
    assert lin.input_dtype(QUANT_MAX_ROWS + 9) == (None if mode == "blocks" else lin.weight.dtype)
    ref = x.double() @ lin.weight.double().T            # the Q8_0 values, unquantized input
    assert torch.allclose(y.double(), ref, rtol=0.05, atol=0.05 * float(ref.abs().max()))


VNNI = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"})


def test_auto_takes_the_blocks_only_in_bf16_on_the_vnni_build_without_amx():
    """auto: the blocks' GEMM for bfloat16 with the AVX-512 VNNI kernels on a CPU without
    AMX; dense for float32 (reference numerics), compiled layers, the AVX2 or no kernels,
    and AMX; forced values and models without blocks as they say."""
    llm = _llm(quantize="q8_0", prefill_matmul="dense")
    model = llm.engine.model
    bf16 = RuntimeConfig(dtype="bfloat16")
    assert prefill_matmul.choose(model, bf16, "q8_0", "avx512-vnni", VNNI).kind == "blocks"
    dense_cases = [(RuntimeConfig(dtype="float32"), "avx512-vnni", VNNI),
                   (RuntimeConfig(dtype="bfloat16", compile="on"), "avx512-vnni", VNNI),
                   (bf16, "avx2", VNNI), (bf16, "torch", VNNI),
                   (bf16, "avx512-vnni", VNNI | {"amx_tile", "amx_int8", "amx_bf16"})]
    for rt, kernels, flags in dense_cases:
        pick = prefill_matmul.choose(model, rt, "q8_0", kernels, flags)
        assert pick.kind == "dense", (rt.dtype, rt.compile, kernels, pick)
    forced = RuntimeConfig(dtype="float32", prefill_matmul="blocks")
    assert prefill_matmul.choose(model, forced, "q8_0", "avx2", frozenset()).kind == "blocks"
    forced = RuntimeConfig(dtype="bfloat16", prefill_matmul="dense")
    assert prefill_matmul.choose(model, forced, "q8_0", "avx512-vnni", VNNI).kind == "dense"
    dense_only = _llm(quantize="none").engine.model
    pick = prefill_matmul.choose(dense_only, bf16, "none", "torch", VNNI)
    assert pick.kind == "dense" and "no blocks" in pick.why


def test_measure_times_both_ways():
    llm = _llm(quantize="q8_0", prefill_matmul="dense")
    lins = [m for m in llm.engine.model.modules() if isinstance(m, Linear) and m.qweight is not None]
    dense, blocks = prefill_matmul.measure(lins[:2], rows=QUANT_MAX_ROWS + 1)
    assert 0 < dense < 1e4 and 0 < blocks < 1e4
