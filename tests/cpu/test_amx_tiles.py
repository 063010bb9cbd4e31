"""The avx512-vnni build's AMX-INT8 tiles (mimo/cpu/csrc/qtile512.cpp, amx_tiles.h): for each
chunk of 16 activation rows each sub-block's integer dots run on the tile unit, and must
equal the VNNI tiles' vpdpbusd sums, so every product equals the VNNI tiles' bit for bit
(those are held to float64 in test_qkernels.py, where the AMX tiles also run as a build of
their own).
Runs where the CPU has AMX-INT8; the switch and its environment variable everywhere."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.kernel_builds import AMX, kernel_build, kernel_builds
from helpers.qblocks import random_blocks

from mimo.cpu import extension
from mimo.cpu.features import CPUFeatureError, amx_wanted, cpu_info
from mimo.cpu.qmatrix import BLOCKS, NAMES

HAS_AMX = AMX in kernel_builds()
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX-INT8")

# (weight rows, activation rows): rows that fill no tile; chunks of 16 activation rows on the
# tile unit (16; 17 = 16 + 1, 24 = 16 + 8 and 31 = 16 + 15 with the rest on the vector dots;
# 32 and 33 = 16 + 16 + 1); below 16 (2, 8, 15) both switches run the vector dots.
SHAPES = [(37, 2), (16, 8), (5, 15), (64, 16), (21, 16), (3, 16), (23, 17), (19, 24),
          (50, 31), (17, 32), (40, 33)]


def _products(mod, amx: bool, x: torch.Tensor, parts, topk: int = 0):
    assert mod.set_amx_tiles(amx) == amx
    if topk:
        return mod.qtopk(x, parts[0].data, parts[0].qtype, topk)
    return mod.qlinear(x, [p.data for p in parts], [p.qtype for p in parts])


@needs_amx
@pytest.mark.parametrize("qtype", list(BLOCKS), ids=[NAMES[q] for q in BLOCKS])
def test_amx_tiles_equal_the_vnni_tiles_bit_for_bit(qtype):
    rng = np.random.default_rng(qtype)
    cols = 512 if BLOCKS[qtype][0] == 256 else 160
    with kernel_build(AMX) as mod:
        for rows, m in SHAPES:
            part = random_blocks(qtype, rows, cols, rng)
            x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32))
            x[0, :32] = 0.0                              # an all-zero activation block
            on = _products(mod, True, x, [part])
            off = _products(mod, False, x, [part])
            assert torch.equal(on, off), (NAMES[qtype], rows, m, float((on - off).abs().max()))


@needs_amx
def test_amx_topk_and_mixed_parts_equal_the_vnni_tiles():
    rng = np.random.default_rng(7)
    parts = [random_blocks(q, 24, 256, rng) for q in (8, 12, 14, 6)]   # one fused projection
    x = torch.from_numpy(rng.standard_normal((32, 256)).astype(np.float32))
    with kernel_build(AMX) as mod:
        assert torch.equal(_products(mod, True, x, parts), _products(mod, False, x, parts))
        head = random_blocks(8, 3000, 256, rng)
        for m in (16, 17, 32):
            on = _products(mod, True, x[:m].contiguous(), [head], topk=5)
            off = _products(mod, False, x[:m].contiguous(), [head], topk=5)
            assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


@needs_amx
def test_amx_tiles_leave_torch_brgemm_working():
    """The tile configuration is per thread and oneDNN loads its own: a bf16 matmul and
    SDPA on oneDNN's tiles, interleaved with AMX products, compute what they computed before
    any, and so do the products (configured once per thread instead of once per call, they
    ran on oneDNN's configuration: the process died of SIGILL)."""
    rng = np.random.default_rng(3)
    part = random_blocks(8, 64, 256, rng)
    x = torch.from_numpy(rng.standard_normal((16, 256)).astype(np.float32))
    a = torch.randn(64, 512).to(torch.bfloat16)
    b = torch.randn(512, 384).to(torch.bfloat16)
    want = a @ b
    q = torch.randn(1, 37, 4, 64).to(torch.bfloat16)
    k = torch.randn(1, 37, 4, 64).to(torch.bfloat16)
    att = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
    with kernel_build(AMX) as mod:
        first = _products(mod, True, x, [part])
        for _ in range(3):
            assert torch.equal(a @ b, want)
            assert torch.equal(_products(mod, True, x, [part]), first)
            assert torch.equal(torch.nn.functional.scaled_dot_product_attention(
                q, k, k, is_causal=True), att)


def test_the_switch_and_its_environment_variable(monkeypatch):
    for isa in [b for b in kernel_builds() if "+" not in b]:
        mod = extension.load(isa)
        before = mod.amx_tiles()
        try:
            assert mod.set_amx_tiles(False) is False
            assert mod.set_amx_tiles(True) is (isa == "avx512-vnni" and HAS_AMX)
        finally:
            mod.set_amx_tiles(before)
    monkeypatch.setenv("MIMO_CPU_AMX", "maybe")
    with pytest.raises(CPUFeatureError, match="MIMO_CPU_AMX must be on or off"):
        amx_wanted()
    for isa in [b for b in kernel_builds() if "+" not in b]:
        with pytest.raises(CPUFeatureError, match="MIMO_CPU_AMX"):
            extension.load(isa)             # refused at every load, not only the first
    monkeypatch.setenv("MIMO_CPU_AMX", "OFF")
    assert amx_wanted() is False
    monkeypatch.delenv("MIMO_CPU_AMX")
    assert amx_wanted() is True


@pytest.mark.skipif(cpu_info().best_isa is None, reason="no kernel build runs on this CPU")
def test_a_process_started_with_amx_off_keeps_the_vnni_tiles():
    code = "from mimo.cpu import extension; print(extension.load().amx_tiles())"
    env = {**os.environ, "MIMO_CPU_AMX": "off"}
    env.pop("MIMO_CPU_ISA", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    env.pop("MIMO_CPU_AMX")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(HAS_AMX and cpu_info().best_isa == "avx512-vnni")
