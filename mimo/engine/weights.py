"""The model's decode weights, chosen once at start-up from the configuration, the model
file and the CPU (RuntimeConfig.weight_format), and reported in one log line: the CPU's
instruction sets, the dtype, the weight format and the kernels in use."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..config import RuntimeConfig
from ..cpu import decode_ops, extension
from ..cpu.features import cpu_info
from ..cpu.qmatrix import repack_types
from ..models.quantized import QuantReport, quantize_q8_0, repack_blocks, use_gguf_blocks
from ..models.registry import LoadedModel
from . import prefill_matmul

log = logging.getLogger("mimo.engine")


@dataclass(frozen=True)
class Weights:
    format: str                   # 'gguf', 'q8_0', 'int8' or 'none'
    kernels: str                  # the CPU kernel build ('avx2', 'avx512-vnni') or 'torch'
    report: QuantReport | None    # what the block formats hold
    fused_layers: int = 0         # decoder layers whose decode steps run as one C++ call
    prefill: str = "dense"        # prefill-sized steps' weights: 'dense' or 'blocks'


def prepare_weights(model, rt: RuntimeConfig, loaded: LoadedModel) -> Weights:
    ext = None
    if rt.device == "cpu" and rt.quantize in ("auto", "gguf", "q8_0"):
        ext = extension.load()
    fmt = rt.weight_format(bool(loaded.blocks), ext is not None)
    report = None
    if fmt == "gguf":
        report = use_gguf_blocks(model, loaded.blocks)
    elif fmt == "q8_0":
        report = quantize_q8_0(model)
    elif fmt == "int8":
        model.quantize_int8()
        if rt.greedy_head != "exact":
            model.lm_head.screen_int4()
    kernels = extension.label(ext) if ext is not None and report is not None else "torch"
    types = repack_types(kernels) if rt.repack == "auto" else frozenset()
    if types:           # kernels is "torch" (no types) where there are no blocks
        report = repack_blocks(model, ext, types)
    fused = 0
    if report is not None and rt.fused_decode == "auto" and hasattr(model, "fuse_decode"):
        ops = decode_ops.load()
        fused = model.fuse_decode(ops) if ops is not None else 0
    log.info("CPU %s; dtype %s, decode weights %s, kernels %s%s; fused decode layers: %d",
             cpu_info().summary(), rt.dtype, fmt, kernels,
             f": {report.summary()}" if report else "", fused)
    prefill = prefill_matmul.choose(model, rt, fmt, kernels, cpu_info().flags).kind
    return Weights(fmt, kernels, report, fused, prefill)
