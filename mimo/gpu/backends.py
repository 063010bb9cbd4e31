"""Choosing the attention backend (`--attention-backend`).

- torch: gathers each sequence's keys and calls SDPA (attention.py); runs anywhere.
- triton: paged kernels over the pools (triton_attention.py); needs a CUDA device, or
  Triton's interpreter (TRITON_INTERPRET=1, CPU tensors: tests only, very slow).
- cpu: the torch backend with mimo's C++ kernels where they apply (cpu_attention.py: decode
  rows read keys in place from the pools; prefill chunks on the bfloat16 flash kernel where
  the CPU has AVX512-BF16, except chunks without sinks on a CPU with AMX, where torch's
  flash kernel runs on the tiles); needs device cpu and the CPU kernels.
- flashinfer: not built into this engine yet; refused with the reason, never replaced by
  another backend silently.
- auto: triton when the device is CUDA and triton imports; cpu on device cpu when the CPU
  kernels load (a cold 3,000-token prefill 3.2 -> 2.4 s on the default model,
  docs/cpu_kernels.md); else torch.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from ..config import ATTENTION_BACKENDS
from .attention import AttentionBackend, TorchAttention

BACKENDS = ATTENTION_BACKENDS     # the config validates the names


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_backend(name: str, device: str) -> str:
    """The backend `name` means on `device` ('auto' decided); raises ValueError, naming
    the problem, when the chosen one cannot run there."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}, "
                         f"not {name!r}")
    cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    if name == "auto":
        if cuda and _triton_importable():
            return "triton"
        return "cpu" if torch.device(device).type == "cpu" and _cpu_kernels() else "torch"
    if name == "cpu":
        if torch.device(device).type != "cpu":
            raise ValueError(f"attention backend cpu runs on device cpu, not {device!r}")
        if not _cpu_kernels():
            raise ValueError("attention backend cpu: the CPU kernels did not build or load "
                             "(see the log line above); use torch")
    if name == "triton":
        if not _triton_importable():
            raise ValueError("attention backend triton: the triton package does not import "
                             "(pip install triton)")
        if not cuda and not _interpreted():
            raise ValueError(f"attention backend triton needs a CUDA device (device is "
                             f"{device!r}); on CPU only Triton's interpreter runs it "
                             f"(TRITON_INTERPRET=1, for tests)")
    if name == "flashinfer":
        if importlib.util.find_spec("flashinfer") is None:
            raise ValueError("attention backend flashinfer: the flashinfer package does not "
                             "import; use triton or torch (or auto)")
        raise ValueError("attention backend flashinfer: flashinfer imports, but this engine "
                         "has no FlashInfer backend yet; use triton or torch (or auto)")
    return name


def _cpu_kernels() -> bool:
    from ..cpu import extension
    return extension.load() is not None


def make_backend(name: str, device: str) -> AttentionBackend:
    chosen = resolve_backend(name, device)
    if chosen == "cpu":
        from .cpu_attention import CPUAttention
        return CPUAttention()
    if chosen == "triton":
        from .triton_attention import TritonAttention  # imports triton: only when chosen
        return TritonAttention()
    return TorchAttention()
