"""The prefill GEMM (`qgemm`: more than 16 activation rows, each weight tile decoded once)
against a plain float64 reference on random blocks of every supported GGML type, and against
`qlinear`'s decode-sized products row by row, for each kernel build this CPU runs (the AVX2
build, which has no GEMM of its own and answers with qlinear, too) and the fallback.

Odd row counts (17 = 2 x 8 + 1, 33, 100, 257), weight rows that fill no 16-row tile, K up to
2048 (whose packed activations are split into several chunks of rows) and few tiles with
many rows (each tile's row groups split between threads) take every loop of the GEMM.
Weights repacked in 8-row tiles (which the VNNI build's GEMM reads two tiles at a time)
are checked the same way, with row counts that end on half a 16-row tile."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.kernel_builds import kernel_build, kernel_builds
from helpers.qblocks import (
    assert_matches_quantized_product,
    assert_within_rounding_bound,
    random_blocks,
    ref_weights,
)

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.cpu.qmatrix import BLOCKS, NAMES, REPACKED, QuantMatrix, repack_types

KERNEL_BUILDS = kernel_builds()


@pytest.fixture(params=KERNEL_BUILDS + ["torch"])
def build(request, monkeypatch):
    """(isa, module): each kernel build this CPU runs (the AMX tiles as one), and the
    fallback (module None)."""
    isa = request.param
    if isa == "torch":
        monkeypatch.setattr(extension, "load", lambda isa=None: None)
        yield isa, None
        return
    with kernel_build(isa) as mod:
        monkeypatch.setattr(extension, "load", lambda isa=None, m=mod: m)
        yield isa, mod


def _qlinear_by_rows(mod, x: torch.Tensor, parts) -> torch.Tensor:
    """qlinear on 16 rows at a time: the decode tiles' products (one row each on AVX2's
    256-bit path when a last chunk has one row)."""
    ws, ts = [p.data for p in parts], [p.qtype for p in parts]
    return torch.cat([mod.qlinear(x[i:i + 16].contiguous(), ws, ts) for i in range(0, len(x), 16)])


def _check_rows(isa: str, y: torch.Tensor, by_rows: torch.Tensor) -> None:
    if isa.startswith("avx512-vnni"):   # the same integer dots and float ops per row (the
        # AMX tiles' integers are the vpdpbusd sums): bit for bit
        assert torch.equal(y, by_rows), float((y - by_rows).abs().max())
    else:                         # qlinear's 8-row tiles vs a last single row: float rounding
        np.testing.assert_allclose(y.numpy(), by_rows.numpy(), rtol=1e-5,
                                   atol=1e-5 * float(by_rows.abs().max()))


# (type, weight rows, K, activation rows): N never a multiple of 16, every M odd but 100;
# K = 2048 with 257 rows: the activations packed for the GEMM take three chunks of rows
CASES = [(qt, n, k, m) for qt in BLOCKS
         for n, k, m in zip((37, 21, 45, 5),
                            (512, 2048, 768, 256) if BLOCKS[qt][0] == 256 else (640, 2048, 96, 160),
                            (17, 257, 100, 33))]


@pytest.mark.parametrize("qtype,n,k,m", CASES,
                         ids=[f"{NAMES[c[0]]}-{c[1]}x{c[2]}-m{c[3]}" for c in CASES])
def test_qgemm_matches_float64_and_qlinear(build, qtype, n, k, m):
    isa, mod = build
    part, x = _case(qtype * 1000 + n + m, qtype, n, k, m)
    _check_gemm(isa, mod, QuantMatrix([part]), part, x)


def _case(seed: int, qtype: int, n: int, k: int, m: int):
    """Random blocks [n, k] and activations [m, k] with an all-zero activation block."""
    rng = np.random.default_rng(seed)
    part = random_blocks(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[m // 2, 32:64] = 0.0
    return part, x


def _check_gemm(isa, mod, qm: QuantMatrix, part, x: np.ndarray) -> torch.Tensor:
    """qm's product with x (more than 16 rows: the GEMM) against the float64 reference of
    `part`'s blocks and, on a kernel build, against qlinear's rows."""
    w = ref_weights(part)
    y = qm.matmul(torch.from_numpy(x))
    y64 = y.numpy().astype(np.float64)
    assert_within_rounding_bound(y64, x, w)
    if mod is not None:
        assert_matches_quantized_product(y64, x, w)
        _check_rows(isa, y, _qlinear_by_rows(mod, torch.from_numpy(x), qm.parts))
    return y


# (type, weight rows, K, activation rows): rows a multiple of 8, 24 and 40 ending on half a
# 16-row tile; K = 2048 with 257 rows: several chunks of packed activation rows
X8_CASES = [(qt, n, k, m) for qt in REPACKED
            for n, k, m in zip((24, 40, 48),
                               (512, 2048, 768) if BLOCKS[qt][0] == 256 else (640, 2048, 96),
                               (17, 257, 100))]


@pytest.fixture(params=KERNEL_BUILDS)
def kernels(request, monkeypatch):
    """(isa, module) of each kernel build (the fallback has no repacked layout)."""
    with kernel_build(request.param) as mod:
        monkeypatch.setattr(extension, "load", lambda isa=None, m=mod: m)
        yield request.param, mod


@pytest.mark.parametrize("qtype,n,k,m", X8_CASES,
                         ids=[f"{NAMES[c[0]]}x8-{c[1]}x{c[2]}-m{c[3]}" for c in X8_CASES])
def test_qgemm_on_repacked_tiles(kernels, qtype, n, k, m):
    isa, mod = kernels
    part, x = _case(qtype * 977 + n + m, qtype, n, k, m)
    packed = part.repacked(mod)
    assert packed.qtype == REPACKED[qtype]
    y = _check_gemm(isa, mod, QuantMatrix([packed]), part, x)
    # the same values as the GGUF blocks' own GEMM, up to the float sums' order
    y_gguf = QuantMatrix([part]).matmul(torch.from_numpy(x))
    np.testing.assert_allclose(y.numpy(), y_gguf.numpy(), rtol=1e-5,
                               atol=1e-5 * float(y_gguf.abs().max()))


def test_mixed_parts_and_few_tiles(build):
    """A fused projection of four types (one tile each or less: row groups split between
    threads), then one Q5_0 part of 3 tiles at 257 rows."""
    isa, mod = build
    rng = np.random.default_rng(5)
    parts = [random_blocks(6, 24, 512, rng), random_blocks(8, 8, 512, rng),
             random_blocks(14, 3, 512, rng), random_blocks(12, 17, 512, rng)]
    x = torch.from_numpy(rng.standard_normal((100, 512)).astype(np.float32))
    y = QuantMatrix(parts).matmul(x)
    each = torch.cat([QuantMatrix([p]).matmul(x) for p in parts], 1)
    tol = 0 if mod is not None else 1e-5     # the fallback's dense GEMM blocks N its own way
    torch.testing.assert_close(y, each, rtol=tol, atol=tol * float(each.abs().max()))
    w = np.concatenate([ref_weights(p) for p in parts])
    assert_within_rounding_bound(y.numpy().astype(np.float64), x.numpy(), w)
    one = [random_blocks(6, 40, 640, rng)]
    x1 = torch.from_numpy(rng.standard_normal((257, 640)).astype(np.float32))
    if mod is not None:
        _check_rows(isa, y, _qlinear_by_rows(mod, x, parts))
        _check_rows(isa, QuantMatrix(one).matmul(x1), _qlinear_by_rows(mod, x1, one))
        # repacked parts beside one kept as stored (the VNNI build keeps Q8_0 so)
        mixed = QuantMatrix(parts).repacked(mod, repack_types("avx512-vnni"))
        assert [p.qtype for p in mixed.parts] == [106, 8, 14, 12]   # 3 and 17 rows: kept
        ym = mixed.matmul(x)
        _check_rows(isa, ym, _qlinear_by_rows(mod, x, mixed.parts))
        np.testing.assert_allclose(ym.numpy(), y.numpy(), rtol=1e-5, atol=1e-5 * float(y.abs().max()))


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
def test_qgemm_checks_its_arguments(isa):
    mod = extension.load(isa)
    rng = np.random.default_rng(1)
    part = random_blocks(8, 20, 64, rng)
    with pytest.raises(RuntimeError, match="K=96"):
        mod.qgemm(torch.zeros(40, 96), [part.data], [8])
    with pytest.raises(RuntimeError, match="unsupported GGML type"):
        mod.qgemm(torch.zeros(40, 64), [part.data], [9])
    with pytest.raises(RuntimeError, match="contiguous float32"):
        mod.qgemm(torch.zeros(40, 64, dtype=torch.float64), [part.data], [8])
