"""Which weights prefill-sized steps (more than QUANT_MAX_ROWS rows) multiply with, chosen
once at start-up: the dense copy (torch's GEMM in the model dtype: oneDNN's bf16 on
AVX-512-BF16) or the GGUF / Q8_0 blocks (the C++ GEMM that decodes each weight tile once per
call, mimo/cpu/csrc/qgemm512.cpp). 'auto' follows a rule measured on this project's CPU
(docs/cpu_kernels.md, "Prefill on the blocks"): the blocks in bfloat16 on the AVX-512 VNNI
build without AMX (a cold prefill ~15-20% faster), else dense. float32 keeps the dense GEMM:
it is the dtype asked for reference numerics, and 8-bit activations in prefill moved a long
prompt's greedy tokens off the float32 reference. The AVX2 build has no GEMM (its 8-row tiles
re-decode the weights per group of rows); on an AMX CPU oneDNN's bf16 tiles are expected to
win (not measured); compiled layers trace the dense GEMM. A rule rather than timing both at
start-up: on a shared machine such a timing flips from start to start, and with it
prefill's numerics. `measure` times both ways, for benchmarks."""
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
from ..models.lm_head import LMHead

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


def auto_rule(rt: RuntimeConfig, kernels: str, cpu_flags: frozenset[str]) -> PrefillMatmul:
    """'auto' for a model with blocks: `kernels` the kernel build in use ('avx2',
    'avx512-vnni', 'avx512-vnni+amx' or 'torch'), `cpu_flags` the CPU's instruction sets
    (features.CPUInfo)."""
    if rt.dtype != "bfloat16":
        return PrefillMatmul("dense", f"{rt.dtype}: the reference numerics")
    if rt.compile == "on":
        return PrefillMatmul("dense", "compiled layers trace the dense GEMM")
    if kernels.partition("+")[0] != "avx512-vnni":
        return PrefillMatmul("dense", f"no int8 GEMM in the {kernels} kernels")
    if "amx_bf16" in cpu_flags:
        return PrefillMatmul("dense", "AMX: oneDNN's bf16 tiles")
    return PrefillMatmul("blocks", "bfloat16 on the AVX-512 VNNI build")


def pack_short_steps(model: nn.Module, rt: RuntimeConfig, pick: PrefillMatmul,
                     cpu_flags: frozenset[str]) -> int:
    """On an AMX CPU in bfloat16, 'auto' also keeps each Linear's dense weight packed for
    oneDNN (`Linear.pack`), which short steps (up to PACKED_MAX_ROWS rows, e.g. a 256-token
    prompt) multiply with: the same products without the per-call repacking (18 layers of
    the default model at 256 rows, weights cold: 37 -> 25 ms). Costs a second copy of the
    dense weights. Returns the Linears packed (0: not this CPU, dtype or choice)."""
    if (rt.prefill_matmul != "auto" or pick.kind != "dense" or rt.dtype != "bfloat16"
            or rt.compile == "on" or rt.device != "cpu" or "amx_bf16" not in cpu_flags
            or not torch.backends.mkldnn.is_available()):
        return 0
    # Not the LM head's: it multiplies a step's last rows only, and is the largest weight.
    head = {id(m) for h in model.modules() if isinstance(h, LMHead) for m in h.modules()}
    lins = [m for m in model.modules() if isinstance(m, Linear) and id(m) not in head
            and m.weight.dtype == torch.bfloat16 and m.weight.dim() == 2]
    for m in lins:
        m.pack()
    mb = sum(m.weight.numel() * 2 for m in lins) / 2**20
    log.info("short steps: %d dense weights packed for oneDNN (AMX; %.0f MiB more)",
             len(lins), mb)
    return len(lins)


def choose(model: nn.Module, rt: RuntimeConfig, fmt: str, kernels: str,
           cpu_flags: frozenset[str]) -> PrefillMatmul:
    """Decide and apply (each block Linear's `prefill_blocks`, and on AMX the packed dense
    weights of `pack_short_steps`): `fmt` the weight format, `kernels` and `cpu_flags` as
    auto_rule takes them. 'blocks' forced without blocks is refused."""
    lins = _block_linears(model)
    if rt.prefill_matmul == "blocks" and not lins:
        raise ConfigError(f"prefill_matmul=blocks needs gguf or q8_0 weights; they are {fmt}")
    if rt.prefill_matmul != "auto":
        pick = PrefillMatmul(rt.prefill_matmul, "forced")
    elif not lins:
        pick = PrefillMatmul("dense", f"no blocks ({fmt} weights)")
    else:
        pick = auto_rule(rt, kernels, cpu_flags)
    for m in lins:
        m.prefill_blocks = pick.kind == "blocks"
    if lins:
        log.info("prefill matmuls: %s (%s)", pick.kind, pick.why)
    pack_short_steps(model, rt, pick, cpu_flags)
    return pick
