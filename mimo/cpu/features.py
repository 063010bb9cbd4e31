"""What the CPU at hand can do, read once: its instruction sets, and the kernel build and
matmul dtype they call for.

Choices made here, written once:
- the C++ kernels' build: `avx512-vnni` where AVX-512 F/BW/VL and VNNI are present, else
  `avx2` where AVX2, FMA and F16C are, else none (plain PyTorch);
- bfloat16 arithmetic only where the CPU has it natively (AVX-512-BF16 or AMX-BF16): on
  others a bf16 matmul runs several times slower than float32.

`MIMO_CPU_ISA=avx2|avx512-vnni|none` forces a build (tests use it to run the AVX2 path on a
machine that has AVX-512); forcing one the CPU lacks is refused. `MIMO_CPU_AMX=off` keeps the
avx512-vnni build's products of 16 activation rows off the AMX-INT8 tile unit (on by default
where the CPU and the OS allow it; the build checks both).
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache

# /proc/cpuinfo flag -> the name we report
_FLAGS = {
    "avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw",
    "avx512vl": "avx512vl", "avx512_vnni": "avx512_vnni", "avx_vnni": "avx_vnni",
    "avx512_bf16": "avx512_bf16", "amx_tile": "amx_tile", "amx_int8": "amx_int8",
    "amx_bf16": "amx_bf16",
}
ISAS = ("avx512-vnni", "avx2")      # best first
_NEEDS = {
    "avx2": {"avx2", "fma", "f16c"},
    "avx512-vnni": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
}


class CPUFeatureError(ValueError):
    """A forced kernel build the CPU cannot run."""


@dataclass(frozen=True)
class CPUInfo:
    model: str
    flags: frozenset[str]       # the instruction sets of _FLAGS this CPU has

    def supports(self, isa: str) -> bool:
        return _NEEDS[isa] <= self.flags

    @property
    def native_bf16(self) -> bool:
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    @property
    def amx_int8(self) -> bool:
        """AMX-TILE and AMX-INT8 listed (whether the OS lets a process use them, the
        kernel build checks when it loads)."""
        return {"amx_tile", "amx_int8"} <= self.flags

    @property
    def best_isa(self) -> str | None:
        return next((i for i in ISAS if self.supports(i)), None)

    def summary(self) -> str:
        return f"{self.model} [{' '.join(sorted(self.flags)) or 'no SIMD extensions known'}]"


@lru_cache(maxsize=1)
def cpu_info() -> CPUInfo:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine()):
                    model = val.strip()
                elif key == "flags":
                    flags = {_FLAGS[x] for x in val.split() if x in _FLAGS}
                    break
    except OSError:
        pass
    return CPUInfo(model, frozenset(flags))


def amx_wanted() -> bool:
    """`MIMO_CPU_AMX`: on (default) or off."""
    v = os.environ.get("MIMO_CPU_AMX", "on").strip().lower()
    if v not in ("on", "off"):
        raise CPUFeatureError(f"MIMO_CPU_AMX must be on or off, not {v!r}")
    return v == "on"


def chosen_isa(info: CPUInfo | None = None) -> str | None:
    """The kernel build to use: `MIMO_CPU_ISA` if set (checked), else the best supported."""
    info = info or cpu_info()
    forced = os.environ.get("MIMO_CPU_ISA", "").strip()
    if not forced:
        return info.best_isa
    if forced == "none":
        return None
    if forced not in ISAS:
        raise CPUFeatureError(f"MIMO_CPU_ISA must be one of {', '.join(ISAS)} or none, "
                              f"not {forced!r}")
    if not info.supports(forced):
        raise CPUFeatureError(f"MIMO_CPU_ISA={forced} needs {' '.join(sorted(_NEEDS[forced]))}; "
                              f"this CPU has {' '.join(sorted(info.flags)) or 'none of them'}")
    return forced
