"""The machine-limit measurement that every speed bench reports its figures against names
what ran: the CPU's flags, mimo's kernel build (forced by $MIMO_CPU_ISA, as for the AVX2
runs on an AVX-512 machine) and torch's vector code ($ATEN_CPU_CAPABILITY)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mimo.cpu.features import cpu_info


def _measure(env: dict[str, str]) -> dict:
    p = subprocess.run([sys.executable, "-m", "mimo.bench.machine_limits", "--quick", "--reps",
                        "1", "--threads", "1"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


AMX = cpu_info().best_isa == "avx512-vnni" and cpu_info().amx_int8


def test_names_the_kernels_in_use():
    res = _measure({})
    assert res["kernel_isa"] == (cpu_info().best_isa or "none") + ("+amx" if AMX else "")
    assert res["cpu_flags"] == sorted(cpu_info().flags)
    assert res["bandwidth_gbs"] > 0 and res["matmul_gflops"] > 0


@pytest.mark.skipif(not cpu_info().supports("avx2"), reason="this CPU has no AVX2 path")
def test_names_a_forced_avx2_run_and_the_amx_tiles_off():
    res = _measure({"MIMO_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2"})
    assert res["kernel_isa"] == "avx2" and res["torch_cpu_capability"] == "AVX2"
    res = _measure({"MIMO_CPU_AMX": "off"})
    assert res["kernel_isa"] == cpu_info().best_isa


def test_read_only_measures_the_read_rate_alone():
    p = subprocess.run([sys.executable, "-m", "mimo.bench.machine_limits", "--read-only", "--quick",
                        "--reps", "1", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["bandwidth_gbs"] == max(res["bandwidth_gbs_by_method"].values()) > 0
    assert res["threads"] == 1 and "matmul_gflops" not in res
