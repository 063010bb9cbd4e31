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
    ref = x.double() @ lin.weight.double().T            # the Q8_0 values, unquantized input
    assert torch.allclose(y.double(), ref, rtol=0.05, atol=0.05 * float(ref.abs().max()))


def test_auto_is_dense_and_blocks_is_opt_in():
    """auto keeps the dense GEMM everywhere (8-bit prefill activations broke a chat model's
    answer: tests/test_first_chat.py), with or without blocks; blocks forced takes them."""
    llm = _llm(quantize="q8_0", prefill_matmul="dense")
    model = llm.engine.model
    for rt in (RuntimeConfig(dtype="bfloat16"), RuntimeConfig(dtype="float32"),
               RuntimeConfig(dtype="bfloat16", compile="on")):
        assert prefill_matmul.choose(model, rt, "q8_0").kind == "dense"
    forced = RuntimeConfig(dtype="bfloat16", prefill_matmul="blocks")
    assert prefill_matmul.choose(model, forced, "q8_0").kind == "blocks"
    dense_only = _llm(quantize="none").engine.model
    assert prefill_matmul.choose(dense_only, RuntimeConfig(), "none").kind == "dense"


def test_measure_times_both_ways():
    llm = _llm(quantize="q8_0", prefill_matmul="dense")
    lins = [m for m in llm.engine.model.modules() if isinstance(m, Linear) and m.qweight is not None]
    dense, blocks = prefill_matmul.measure(lins[:2], rows=QUANT_MAX_ROWS + 1)
    assert 0 < dense < 1e4 and 0 < blocks < 1e4
