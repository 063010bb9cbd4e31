"""The block-quantized kernels against a plain float64 reference, on random blocks of every
supported GGML type, odd sizes included, for each kernel build this CPU can run (the AVX2
build is run on AVX-512 machines too) and for the plain PyTorch fallback.

Two references, both independent of the kernels: the weights are decoded by the `gguf`
package; activations are quantized here in numpy as llama.cpp does (float32 scale
amax/127, round to nearest even), and the product is taken in float64. The kernels must
match that product to float32 rounding, and the unquantized float64 product within the
activation quantization's bound."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.kernel_builds import kernel_build, kernel_builds
from helpers.qblocks import (
    FP16_FIELDS,
    assert_matches_quantized_product,
    assert_within_rounding_bound,
    random_blocks,
    ref_weights,
)

from mimo.cpu import extension
from mimo.cpu.qmatrix import BLOCKS, NAMES, QuantMatrix, QuantPart

BUILDS = kernel_builds() + ["torch"]


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch):
    """Each kernel build this CPU runs (the AMX tiles as one), and the fallback (the
    extension reported missing)."""
    if request.param == "torch":
        monkeypatch.setattr(extension, "load", lambda isa=None: None)
        yield request.param
        return
    with kernel_build(request.param) as mod:
        monkeypatch.setattr(extension, "load", lambda isa=None, m=mod: m)
        yield request.param


# Weight rows that fill no tile (16 rows on AVX-512, 8 on AVX2), and activation row counts
# that take each loop of the tiles (1, 2, 16: their own; 11, 5: the one bounded at run time;
# 17: 16 + 1, or 8 + 8 + 1; on the AMX tiles 16 and 17's 16); a single row takes the
# 256-bit path in the AVX2 build.
CASES = [(qt, rows, cols, m) for qt in BLOCKS
         for rows, m, cols in zip((37, 5, 19, 33, 64, 21), (1, 2, 11, 5, 16, 17),
                                  ((512, 768, 256) if BLOCKS[qt][0] == 256 else (96, 160, 640)) * 2)]


@pytest.mark.parametrize("qtype,rows,cols,m", CASES,
                         ids=[f"{NAMES[c[0]]}-{c[1]}x{c[2]}-m{c[3]}" for c in CASES])
def test_qlinear_matches_float64(build, qtype, rows, cols, m):
    rng = np.random.default_rng(qtype * 1000 + rows + m)
    part = random_blocks(qtype, rows, cols, rng)
    x = rng.standard_normal((m, cols)).astype(np.float32)
    x[0, :32] = 0.0                                   # an all-zero activation block
    w = ref_weights(part)
    y = QuantMatrix([part]).matmul(torch.from_numpy(x)).numpy().astype(np.float64)
    # the unquantized product, within the activation rounding's bound: |x - d q| <= d / 2
    assert_within_rounding_bound(y, x, w)
    if build == "torch":
        return
    assert_matches_quantized_product(y, x, w)


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=[NAMES[q] for q in BLOCKS])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_extreme_quants_do_not_overflow(build, qtype, sign):
    """Every quant at its extreme (Q8_0: -128; others: all bits set) against activations that
    all quantize to +-127: the largest products the integer dots meet, where a 16-bit
    intermediate sum would saturate."""
    rng = np.random.default_rng(11)
    part = random_blocks(qtype, 19, 512, rng)
    raw = part.data.numpy().reshape(-1, BLOCKS[qtype][1]).copy()
    fp16 = np.zeros(raw.shape[1], dtype=bool)
    for off in FP16_FIELDS[qtype]:
        fp16[off:off + 2] = True
    raw[:, ~fp16] = 0x80 if qtype == 8 else 0xFF
    part = QuantPart(torch.from_numpy(raw.reshape(part.data.shape)), qtype, 512)
    w = ref_weights(part)
    for m in (1, 3):
        x = np.full((m, 512), sign, dtype=np.float32)
        y = QuantMatrix([part]).matmul(torch.from_numpy(x)).numpy().astype(np.float64)
        ref = x.astype(np.float64) @ w.T              # x quantizes exactly (127 * (1/127))
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(w).sum(1).max())


def test_fused_parts_of_mixed_types(build):
    """A fused projection whose parts have different types (Q5_0, Q5_0, Q8_0 as q/k/v)."""
    rng = np.random.default_rng(7)
    parts = [random_blocks(6, 24, 640, rng), random_blocks(6, 8, 640, rng),
             random_blocks(8, 8, 640, rng)]
    x = rng.standard_normal((3, 640)).astype(np.float32)
    y = QuantMatrix(parts).matmul(torch.from_numpy(x)).numpy()
    each = [QuantMatrix([p]).matmul(torch.from_numpy(x)).numpy() for p in parts]
    np.testing.assert_allclose(y, np.concatenate(each, 1), rtol=1e-6, atol=1e-6)
    w = np.concatenate([ref_weights(p) for p in parts])
    assert_within_rounding_bound(y.astype(np.float64), x, w)


@pytest.mark.parametrize("qtype", [8, 14, 6])
@pytest.mark.parametrize("m,k", [(1, 1), (4, 16), (9, 5), (16, 1), (17, 3)])
def test_topk_equals_sorted_scores(build, qtype, m, k):
    rng = np.random.default_rng(qtype + 31 * m + k)
    cols = 256 if BLOCKS[qtype][0] == 256 else 640
    part = random_blocks(qtype, 2000, cols, rng)
    x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32))
    qm = QuantMatrix([part])
    scores = qm.matmul(x)
    vals, idx = qm.topk(x, k)
    ref = torch.sort(scores, dim=1, descending=True, stable=True)
    assert torch.equal(idx, ref.indices[:, :k])
    torch.testing.assert_close(vals, ref.values[:, :k], rtol=0, atol=0)


def test_topk_ties_go_to_the_lower_index(build):
    rng = np.random.default_rng(3)
    part = random_blocks(8, 600, 64, rng)
    block = np.concatenate([np.array([0.05], np.float16).view(np.uint8),
                            np.full(32, 127, dtype=np.int8).view(np.uint8)])
    data = part.data.clone()
    data[5] = data[517] = torch.from_numpy(np.tile(block, 2))   # equal rows: equal best scores
    qm = QuantMatrix([QuantPart(data, 8, 64)])
    x = torch.ones(1, 64)
    vals, idx = qm.topk(x, 2)
    assert idx.tolist() == [[5, 517]] and vals[0, 0] == vals[0, 1]


@pytest.mark.parametrize("kb", kernel_builds())
@pytest.mark.parametrize("repack", [False, True])
def test_products_do_not_depend_on_the_threads(kb, repack):
    """Threads take runs of weight tiles (top-k: chunks of rows) as they come free, so which
    thread computes what differs from call to call; no output may. qlinear over a fused
    projection and top-k over a head-like matrix, with 1 to 5 threads (more than the cores:
    some stall while the others take their runs), bit for bit against one thread; on the
    GGUF blocks and on the 8-row tiles' layouts."""
    rng = np.random.default_rng(11)
    parts = [random_blocks(6, 520, 640, rng), random_blocks(8, 264, 640, rng),
             random_blocks(2, 136, 640, rng)]
    qm, head = QuantMatrix(parts), QuantMatrix([random_blocks(8, 5000, 640, rng)])
    before = torch.get_num_threads()
    with kernel_build(kb) as mod:
        if repack:
            qm, head = qm.repacked(mod), head.repacked(mod)
        out: dict = {}
        try:
            for threads in (1, 2, 3, 5):
                torch.set_num_threads(threads)
                for m in (1, 4):
                    x = torch.from_numpy(np.random.default_rng(m).standard_normal((m, 640))
                                         .astype(np.float32))
                    for _ in range(3):
                        got = (mod.qlinear(x, [p.data for p in qm.parts],
                                           [p.qtype for p in qm.parts]),
                               *mod.qtopk(x, head.parts[0].data, head.parts[0].qtype, 7))
                        ref = out.setdefault(m, got)
                        assert all(torch.equal(a, b) for a, b in zip(got, ref)), (threads, m)
        finally:
            torch.set_num_threads(before)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="do not hold rows"):
        QuantPart(torch.zeros(4, 33, dtype=torch.uint8), 8, 32)
    with pytest.raises(ValueError, match="no kernel"):
        QuantPart(torch.zeros(4, 34, dtype=torch.uint8), 10, 32)
