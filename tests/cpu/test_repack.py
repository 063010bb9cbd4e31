"""Q5_0, Q8_0, Q4_K and Q6_K weights repacked into 8-row tiles (`QuantPart.repacked`, type
ids 106, 108, 112, 114),
on every kernel build this CPU runs (the AVX2 build is the one that repacks at start-up; the
VNNI build multiplies the same layout too): the products against the plain float64
reference of the original GGUF blocks (decoded by the `gguf` package, activations quantized
in numpy as llama.cpp does), the layout's inverse, and refusals."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.qblocks import (
    FP16_FIELDS,
    assert_matches_quantized_product,
    assert_within_rounding_bound,
    random_blocks,
    ref_weights,
)

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.cpu.qmatrix import BLOCKS, NAMES, REPACKED, QuantMatrix, QuantPart

Q4_0, Q5_0, Q8_0, Q4_K, Q6_K = 2, 6, 8, 12, 14

BUILDS = [i for i in ISAS if cpu_info().supports(i)]


@pytest.fixture(params=BUILDS)
def ext(request, monkeypatch):
    mod = extension.load(request.param)
    assert mod is not None, f"the {request.param} build failed on a CPU that supports it"
    monkeypatch.setattr(extension, "load", lambda isa=None, m=mod: m)
    return mod


# (rows, cols, activation rows): one tile and several, K of one block and many, activation
# rows taking each loop (1-4 and 8 their own, 5 the general one, 9 and 17: 8 + the rest)
SHAPES = [(8, 1, 1), (16, 20, 1), (24, 3, 2), (64, 20, 3), (40, 5, 4), (8, 10, 5),
          (32, 20, 8), (48, 2, 9), (64, 20, 17)]        # (rows, blocks of 32, activation rows)
CASES = [(qt, r, 32 * b if BLOCKS[qt][0] == 32 else 256 * max(1, b // 4), m)
         for qt in REPACKED for r, b, m in SHAPES]


@pytest.mark.parametrize("qtype,rows,cols,m", CASES,
                         ids=[f"{NAMES[q]}-{r}x{c}-m{m}" for q, r, c, m in CASES])
def test_repacked_product_matches_float64(ext, qtype, rows, cols, m):
    rng = np.random.default_rng(qtype * 1000 + rows * 100 + cols + m)
    part = random_blocks(qtype, rows, cols, rng)
    packed = part.repacked(ext)
    assert packed.qtype == REPACKED[qtype] and packed.rows == rows
    assert not torch.equal(packed.data[:, :part.data.shape[1]], part.data)
    x = rng.standard_normal((m, cols)).astype(np.float32)
    x[0, :32] = 0.0                                   # an all-zero activation block
    y = QuantMatrix([packed]).matmul(torch.from_numpy(x)).numpy().astype(np.float64)
    w = ref_weights(part)
    assert_within_rounding_bound(y, x, w)
    assert_matches_quantized_product(y, x, w)


@pytest.mark.parametrize("qtype", list(REPACKED), ids=[NAMES[q] for q in REPACKED])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_extreme_quants_do_not_overflow(ext, qtype, sign):
    """All quant bits set (Q5_0: q = 15 with the fifth bit, the unsigned byte 31; Q4_K: 15,
    scales and mins 63; Q6_K: the unsigned byte 63, scales -1; Q8_0: every quant -128,
    whose magnitude 128 is the sign trick's largest byte) against activations that all
    quantize to +-127: the vpmaddubsw pairs summed in int16 (four, or two for Q6_K, one
    for Q8_0) meet their largest values here."""
    rng = np.random.default_rng(5)
    part = random_blocks(qtype, 16, 512, rng)
    nbytes = part.data.shape[1] // (512 // BLOCKS[qtype][0])
    raw = part.data.numpy().reshape(-1, nbytes).copy()
    fp16 = np.zeros(nbytes, dtype=bool)
    for off in FP16_FIELDS[qtype]:
        fp16[off:off + 2] = True
    raw[:, ~fp16] = 0x80 if qtype == Q8_0 else 0xFF
    part = QuantPart(torch.from_numpy(raw.reshape(part.data.shape)), qtype, 512)
    w = ref_weights(part)
    for m in (1, 3):
        x = np.full((m, 512), sign, dtype=np.float32)
        y = QuantMatrix([part.repacked(ext)]).matmul(torch.from_numpy(x)).numpy()
        ref = x.astype(np.float64) @ w.T
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(w).sum(1).max())


@pytest.mark.parametrize("qtype", list(REPACKED), ids=[NAMES[q] for q in REPACKED])
def test_unpacked_gives_the_gguf_blocks_back(ext, qtype):
    """Every bit of the blocks survives the round trip (random bytes: every scale bit of
    Q4_K's packed 6-bit scales and mins is set somewhere)."""
    rng = np.random.default_rng(9)
    part = random_blocks(qtype, 24, 768, rng)
    packed = part.repacked(ext)
    assert torch.equal(packed.unpacked().data, part.data)
    assert torch.equal(packed.dequantize(), part.dequantize())
    idx = torch.tensor([3, 17, 0, 17, 9])         # across tiles, unsorted, repeated
    sel = QuantMatrix([packed]).select_rows(idx)
    assert sel.parts[0].qtype == qtype
    assert torch.equal(sel.parts[0].data, part.data.index_select(0, idx))


def test_mixed_parts_and_topk(ext):
    """A fused projection of repacked Q5_0, Q4_K, Q6_K and Q8_0 parts and a Q4_0 one (no
    repacked layout) equals its parts side by side; top-k over a repacked matrix equals the
    sorted scores."""
    rng = np.random.default_rng(4)
    parts = [random_blocks(Q5_0, 24, 768, rng), random_blocks(Q4_K, 8, 768, rng),
             random_blocks(Q6_K, 16, 768, rng), random_blocks(Q8_0, 8, 768, rng),
             random_blocks(Q4_0, 8, 768, rng)]
    qm = QuantMatrix(parts).repacked(ext)
    assert [p.qtype for p in qm.parts] == [REPACKED[Q5_0], REPACKED[Q4_K], REPACKED[Q6_K],
                                           REPACKED[Q8_0], Q4_0]
    x = torch.from_numpy(rng.standard_normal((3, 768)).astype(np.float32))
    y = qm.matmul(x)
    each = torch.cat([QuantMatrix([p]).matmul(x) for p in parts], 1)
    torch.testing.assert_close(y, each, rtol=1e-5, atol=1e-5)
    for qt in (Q4_K, Q8_0):     # more rows than one of top-k's chunks (1,024)
        big = QuantMatrix([random_blocks(qt, 1040, 768, rng)]).repacked(ext)
        vals, idx = big.topk(x, 5)
        ref = torch.sort(big.matmul(x), dim=1, descending=True, stable=True)
        assert torch.equal(idx, ref.indices[:, :5])


def test_only_whole_tiles_are_repacked_and_bad_layouts_refused(ext):
    rng = np.random.default_rng(2)
    odd = random_blocks(Q5_0, 12, 64, rng)
    assert odd.repacked(ext) is odd                   # 12 rows: not whole tiles, kept
    q4 = random_blocks(Q4_0, 16, 64, rng)
    assert q4.repacked(ext) is q4                     # no repacked layout for Q4_0
    with pytest.raises(ValueError, match="multiple of 8 rows"):
        QuantPart(odd.data, REPACKED[Q5_0], 64)
    with pytest.raises(RuntimeError, match="multiple of 8 rows"):
        ext.repack_x8(odd.data, Q5_0)
    with pytest.raises(RuntimeError, match="no repacked layout"):
        ext.repack_x8(q4.data, Q4_0)
    with pytest.raises(RuntimeError, match="multiple of 8 rows"):
        ext.qlinear(torch.zeros(1, 64), [odd.data], [REPACKED[Q5_0]])


def test_the_flag_reaches_the_runtime_config_and_bad_values_are_refused():
    import argparse

    from mimo.config import ConfigError, RuntimeConfig
    from mimo.flags import add_engine_flags, engine_opts
    p = argparse.ArgumentParser()
    add_engine_flags(p)
    assert engine_opts(p.parse_args([]))["repack"] == "auto"
    assert engine_opts(p.parse_args(["--repack", "off"]))["repack"] == "off"
    with pytest.raises(SystemExit):
        p.parse_args(["--repack", "always"])
    assert RuntimeConfig(repack="off").repack == "off"
    with pytest.raises(ConfigError, match="repack must be auto or off"):
        RuntimeConfig(repack="always")
