"""The kernel builds a test runs on this CPU, the AMX-INT8 tiles of the avx512-vnni build
counted as a build of their own: "avx512-vnni" runs with them switched off (the VNNI tiles,
as on an AVX-512 CPU without AMX), "avx512-vnni+amx" with them on, where the CPU has them."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info

AMX = "avx512-vnni+amx"


def kernel_builds() -> list[str]:
    builds = [i for i in ISAS if cpu_info().supports(i)]
    if "avx512-vnni" in builds and cpu_info().amx_int8:
        builds.insert(builds.index("avx512-vnni") + 1, AMX)
    return builds


@contextmanager
def kernel_build(build: str) -> Iterator[ModuleType]:
    """The build's module with its AMX tiles switched as `build` says, restored after."""
    isa, _, amx = build.partition("+")
    mod = extension.load(isa)
    assert mod is not None, f"the {isa} build failed on a CPU that supports it"
    assert mod.isa() == isa
    before = mod.amx_tiles()
    assert mod.set_amx_tiles(bool(amx)) == bool(amx), \
        "the CPU lists AMX-INT8 but the kernels cannot use it (the OS refused?)"
    try:
        yield mod
    finally:
        mod.set_amx_tiles(before)
