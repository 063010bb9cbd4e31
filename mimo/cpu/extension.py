"""Build (once) and load the C++ kernels for the instruction set chosen by `features`.

Builds are cached under `$MIMO_KERNEL_CACHE` (default `~/.cache/mimo/kernels`), one folder
per instruction set, torch version and source hash, so a second process (or a second
start) loads the shared object without compiling. Where the build or the load fails (no
compiler, an unsupported CPU), `load()` returns None once, logs one line saying why and that
mimo runs its plain PyTorch kernels, and every caller falls back.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

from .features import amx_wanted, chosen_isa

log = logging.getLogger("mimo.cpu")

_CSRC = Path(__file__).parent / "csrc"
_SRCS = [_CSRC / n for n in ("qmatmul.cpp", "qkernels.cpp", "qtile512.cpp", "amx_tiles.cpp",
                              "qtile256.cpp", "qrepack256.cpp", "qrepack_io.cpp",
                              "qgemm512.cpp", "qproduct.cpp", "attention.cpp", "decode_ops.cpp",
                              "decode_layer.cpp",
                              "decode_attention.cpp", "prefill_attention.cpp",
                              "prefill_attention_amx.cpp",
                              "elementwise.cpp", "fused_norms.cpp", "kv_write.cpp",
                              "dequant.cpp")]
_HEADERS = [_CSRC / n for n in ("qcommon.h", "qpack.h", "qrepack.h", "qrepack_regs.h", "qdecode512.h",
                                 "amx_tiles.h", "kernels.h", "qproduct.h", "attn_steps.h",
                                 "decode_layer.h", "decode_math.h", "team.h",
                                 "vec_math.h", "rows_io.h", "prefill_span.h")]
_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DMIMO_ISA_AVX2"],
    "avx512-vnni": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
                    "-mavx512vnni", "-mamx-tile", "-mamx-int8", "-DMIMO_ISA_VNNI"],
}
_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}
_default: dict[str | None, ModuleType | None] = {}   # by $MIMO_CPU_ISA


def _import(name: str, so: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, so)
    assert spec is not None and spec.loader is not None, so
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def label(mod: ModuleType) -> str:
    """A loaded build's name as reports give it: its instruction set, "+amx" while its
    16-row products run on the AMX-INT8 tiles."""
    return mod.isa() + ("+amx" if mod.amx_tiles() else "")


def cache_dir(isa: str) -> Path:
    root = Path(os.environ.get("MIMO_KERNEL_CACHE", Path.home() / ".cache" / "mimo" / "kernels"))
    h = hashlib.sha256(" ".join(_FLAGS[isa]).encode())
    for src in _SRCS + _HEADERS:
        h.update(src.read_bytes())
    digest = h.hexdigest()[:12]
    return root / f"{isa}-torch{torch.__version__.replace('+', '_')}-{digest}"


def load(isa: str | None = None) -> ModuleType | None:
    """The kernels for `isa` (default: the chosen one), building them on first use; None
    (and one log line) when they cannot be had."""
    if isa is None:                 # every quantized matmul asks: answer from a dict
        forced = os.environ.get("MIMO_CPU_ISA")
        if forced in _default:
            return _default[forced]
        mod = _load(chosen_isa())
        _default[forced] = mod
        return mod
    return _load(isa)


def loaded() -> ModuleType | None:
    """The default kernels if this process has loaded them already (never builds)."""
    return _default.get(os.environ.get("MIMO_CPU_ISA"))


def _load(isa: str | None) -> ModuleType | None:
    if isa is None:
        return _fail("none", "no supported instruction set (AVX2+FMA+F16C at least), or "
                             "MIMO_CPU_ISA=none")
    want_amx = amx_wanted()        # an invalid MIMO_CPU_AMX raises at every load, as ISA's does
    with _lock:
        if isa in _loaded:
            return _loaded[isa]
        from torch.utils import cpp_extension
        build = cache_dir(isa)
        build.mkdir(parents=True, exist_ok=True)
        name = f"mimo_qkernels_{isa.replace('-', '_')}"
        _clear_stale_lock(build)
        so = build / f"{name}.so"
        cached = so.exists() and not (build / "lock").exists()
        t0 = time.perf_counter()
        try:
            # The folder is keyed by the sources' hash, so a finished build is these sources'
            # build: load it as it is. torch's builder would rerun ninja whenever another
            # checkout of the same sources (another path) built there last.
            mod = _import(name, so) if cached else cpp_extension.load(
                name=name, sources=[str(s) for s in _SRCS], build_directory=str(build),
                extra_cflags=["-O3", "-fopenmp", *_FLAGS[isa]], extra_ldflags=["-fopenmp"],
                verbose=False)
        except Exception as e:       # a missing compiler shows as several exception types
            _loaded[isa] = None
            return _fail(isa, f"build failed ({type(e).__name__}: {str(e).strip()[:200]})")
        _loaded[isa] = mod
        amx = mod.set_amx_tiles(want_amx)
        log.info("CPU kernels: %s build %s%s", isa, "loaded from the cache" if cached
                 else f"compiled in {time.perf_counter() - t0:.1f} s",
                 "; 16-row batches on AMX-INT8 tiles" if amx else "")
        return mod


STALE_LOCK_S = 900


def _clear_stale_lock(build: Path) -> None:
    """torch's builder waits on a `lock` file for as long as it exists; a build killed
    mid-way leaves it behind and every later start would hang. A build takes well under
    STALE_LOCK_S (about a minute here), so an older lock is a dead build's."""
    lock = build / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            log.warning("removing a stale kernel build lock %s", lock)
            lock.unlink()
    except FileNotFoundError:
        pass


_warned: set[str] = set()


def _fail(isa: str, why: str) -> None:
    if isa not in _warned:          # one line per process, however often callers ask
        _warned.add(isa)
        log.warning("CPU kernels (%s) unavailable: %s; running the plain PyTorch kernels",
                    isa, why)
    return None
