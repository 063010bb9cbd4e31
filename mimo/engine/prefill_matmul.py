"""Which weights prefill-sized steps (more than QUANT_MAX_ROWS rows) multiply with, chosen
once at start-up: the dense copy (torch's GEMM in the model dtype: oneDNN's bf16 on
AVX-512-BF16) or the GGUF / Q8_0 blocks (the C++ GEMM that decodes each weight tile once per
call, mimo/cpu/csrc/qgemm512.cpp). 'auto' follows a rule measured on this project's CPU
(docs/cpu_kernels.md, "Prefill on the blocks"): dense. The blocks' GEMM is faster in bf16
on the AVX-512 VNNI build without AMX, but 8-bit activations in prefill broke a chat
model's answer (SmolLM2-135M-Instruct, the README's first chat), so it is opt-in.
float32 keeps the dense GEMM: it is the dtype asked for reference numerics, and 8-bit
activations in prefill moved a long prompt's greedy tokens off the float32 reference. A
rule rather than timing both at start-up: on a shared machine such a timing flips from
start to start, and with it prefill's numerics. `measure` times both ways, for benchmarks."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError, RuntimeConfig
from ..models.layers import Linear

log = logging.getLogger("mimo.engine")

CALIBRATION_ROWS = 256    # a prefill chunk's size: both GEMMs are past their small-M regime
REPEATS = 3               # best of, each way, interleaved (the machine may be shared)


@dataclass(frozen=True)
class PrefillMatmul:
    kind: str             # 'dense' or 'blocks'
    why: str              # for the log line: forced, measured (with the times), or no blocks


def _block_linears(model: nn.Module) -> list[Linear]:
    return [m for m in model.modules() if isinstance(m, Linear) and m.qweight is not None]


def _dense(m: Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x.to(m.weight.dtype), m.weight)


def _blocks(m: Linear, x: torch.Tensor) -> torch.Tensor:
    assert m.qweight is not None
    return m.qweight.matmul(x).to(m.weight.dtype)


def _ms(fn: Callable[[Linear, torch.Tensor], torch.Tensor], m: Linear, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    fn(m, x)
    return (time.perf_counter() - t0) * 1e3


def measure(lins: list[Linear], rows: int = CALIBRATION_ROWS) -> tuple[float, float]:
    """(dense ms, blocks ms): the products of `lins` at `rows` rows, each the best of
    REPEATS runs after one warm-up, the two ways interleaved."""
    dense, blocks = [float("inf")] * len(lins), [float("inf")] * len(lins)
    with torch.inference_mode():
        xs = [torch.randn(rows, m.weight.shape[1]) for m in lins]
        for r in range(REPEATS + 1):
            for i, (m, x) in enumerate(zip(lins, xs)):
                d, b = _ms(_dense, m, x), _ms(_blocks, m, x)
                if r:                       # run 0 warms both up
                    dense[i], blocks[i] = min(dense[i], d), min(blocks[i], b)
    return sum(dense), sum(blocks)


def choose(model: nn.Module, rt: RuntimeConfig, fmt: str) -> PrefillMatmul:
    """Decide and apply (each block Linear's `prefill_blocks`): `fmt` the weight format.
    'blocks' forced without blocks is refused."""
    lins = _block_linears(model)
    if rt.prefill_matmul == "blocks" and not lins:
        raise ConfigError(f"prefill_matmul=blocks needs gguf or q8_0 weights; they are {fmt}")
    if rt.prefill_matmul != "auto":
        pick = PrefillMatmul(rt.prefill_matmul, "forced")
    elif not lins:
        pick = PrefillMatmul("dense", f"no blocks ({fmt} weights)")
    else:
        # The blocks' GEMM is faster in bf16 on the VNNI build (docs/cpu_kernels.md), but not
        # the default: with 8-bit activations in prefill, SmolLM2-135M-Instruct answers the
        # README's chat with nonsense, though its products equal qlinear's row by row.
        pick = PrefillMatmul("dense", "8-bit prefill activations are opt-in (blocks)")
    for m in lins:
        m.prefill_blocks = pick.kind == "blocks"
    if lins:
        log.info("prefill matmuls: %s (%s)", pick.kind, pick.why)
    return pick
