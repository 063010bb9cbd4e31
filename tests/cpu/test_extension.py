"""Choosing, building and loading the kernels: the instruction set chosen from the CPU's
flags or forced, the build cached across processes, and a machine without a working
compiler falling back to the plain PyTorch path with one log line, the engine with it."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest

from mimo.cpu import extension
from mimo.cpu.features import ISAS, CPUFeatureError, CPUInfo, chosen_isa, cpu_info

AVX2_ONLY = CPUInfo("test cpu", frozenset({"avx2", "fma", "f16c"}))
FULL = CPUInfo("test cpu", frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw",
                                      "avx512vl", "avx512_vnni", "avx512_bf16"}))


def test_best_build_follows_the_flags(monkeypatch):
    monkeypatch.delenv("MIMO_CPU_ISA", raising=False)
    assert chosen_isa(AVX2_ONLY) == "avx2" and not AVX2_ONLY.native_bf16
    assert chosen_isa(FULL) == "avx512-vnni" and FULL.native_bf16
    assert chosen_isa(CPUInfo("old", frozenset({"avx2"}))) is None   # no FMA / F16C


def test_forced_build_is_checked(monkeypatch):
    monkeypatch.setenv("MIMO_CPU_ISA", "avx2")
    assert chosen_isa(FULL) == "avx2"
    monkeypatch.setenv("MIMO_CPU_ISA", "none")
    assert chosen_isa(FULL) is None
    monkeypatch.setenv("MIMO_CPU_ISA", "avx512-vnni")
    with pytest.raises(CPUFeatureError, match="avx512_vnni"):
        chosen_isa(AVX2_ONLY)
    monkeypatch.setenv("MIMO_CPU_ISA", "sse2")
    with pytest.raises(CPUFeatureError, match="must be one of"):
        chosen_isa(FULL)


def test_auto_dtype_is_float32_without_native_bf16(monkeypatch):
    import mimo.cpu.features as features
    from mimo.config import RuntimeConfig
    for info, want in ((AVX2_ONLY, "float32"), (FULL, "bfloat16")):
        monkeypatch.setattr(features, "cpu_info", lambda info=info: info)
        assert RuntimeConfig().dtype == want
    assert RuntimeConfig(dtype="float32").dtype == "float32"


def _load_in_subprocess(env: dict) -> subprocess.CompletedProcess:
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "from mimo.cpu import extension\n"
            "m = extension.load(); print('LOADED', m is not None and m.isa())\n")
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900)


def test_second_process_loads_the_cached_build():
    isa = cpu_info().best_isa
    assert isa is not None, "this CPU runs no kernel build"
    assert extension.load(isa) is not None          # built (or loaded) here first
    r = _load_in_subprocess({"MIMO_CPU_ISA": isa})
    assert f"LOADED {isa}" in r.stdout and "loaded from the cache" in r.stdout, r.stdout + r.stderr


def test_no_compiler_falls_back_with_one_line(tmp_path):
    """A fresh cache and a compiler that does not exist: the build fails, load() says so
    once and returns None; the engine then runs the plain path (tested in test_qkernels)."""
    r = _load_in_subprocess({"MIMO_KERNEL_CACHE": str(tmp_path), "CXX": "/nonexistent/c++"})
    assert "LOADED False" in r.stdout, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "unavailable" in ln]
    assert len(lines) == 1 and "plain PyTorch" in lines[0], r.stdout


def test_engine_reports_the_kernels_in_use(caplog, tiny_gemma3):
    from helpers.tiny_models import loaded_from_hf

    from mimo import LLM
    with caplog.at_level(logging.INFO, logger="mimo.engine"):
        llm = LLM("tiny", loaded=loaded_from_hf(tiny_gemma3), dtype="float32", quantize="q8_0",
                  kv_cache_memory="2MiB", progress=False)
    w = llm.engine.weights
    isa, _, amx = w.kernels.partition("+")
    assert w.format == "q8_0" and isa in ISAS
    assert amx == ("amx" if extension.load(isa).amx_tiles() else "")
    line = next(r.getMessage() for r in caplog.records if "decode weights" in r.getMessage())
    assert cpu_info().model in line and w.kernels in line and "q8_0" in line


def test_a_dead_builds_lock_is_cleared(tmp_path):
    """A build killed mid-way leaves torch's `lock` file; an old one is removed (else every
    later start waits on it forever), a fresh one (a build in progress) is kept."""
    lock = tmp_path / "lock"
    lock.touch()
    extension._clear_stale_lock(tmp_path)
    assert lock.exists()
    old = lock.stat().st_mtime - extension.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    extension._clear_stale_lock(tmp_path)
    assert not lock.exists()


def test_a_finished_build_is_loaded_without_the_builder(tmp_path):
    """Another checkout of the same sources (another path) that built into the shared cache
    last must not make this one rebuild: a finished build (its .so, no lock) is imported as
    it is. Here the builder is made to fail: the load must not reach it."""
    isa = cpu_info().best_isa
    assert extension.load(isa) is not None
    src = extension.cache_dir(isa)
    dst = tmp_path / src.name
    dst.mkdir()
    name = f"mimo_qkernels_{isa.replace('-', '_')}.so"
    shutil.copy(src / name, dst / name)
    (dst / "build.ninja").write_text("# another checkout's build file\n")
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "import torch.utils.cpp_extension as ce\n"
            "def refuse(*a, **k): raise RuntimeError('the builder ran')\n"
            "ce.load = refuse\n"
            "from mimo.cpu import extension\n"
            "m = extension.load(); print('LOADED', m is not None and m.isa())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MIMO_KERNEL_CACHE": str(tmp_path), "MIMO_CPU_ISA": isa})
    assert f"LOADED {isa}" in r.stdout and "loaded from the cache" in r.stdout, r.stdout + r.stderr
    (dst / "lock").touch()          # a build in progress: not imported half-written
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MIMO_KERNEL_CACHE": str(tmp_path), "MIMO_CPU_ISA": isa})
    assert "LOADED False" in r.stdout and "the builder ran" in r.stdout, r.stdout + r.stderr
