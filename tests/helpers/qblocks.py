"""Random GGUF blocks of every type the CPU kernels take, and the plain references the
kernel tests hold them to: weights decoded by the `gguf` package, activations quantized in
numpy as llama.cpp does, products in float64."""
from __future__ import annotations

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from mimo.cpu.qmatrix import BLOCKS, QuantPart

# byte offsets of each type's fp16 scale fields inside a block
FP16_FIELDS = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 12: [0, 2], 13: [0, 2], 14: [208]}


def random_blocks(qtype: int, rows: int, cols: int, rng: np.random.Generator) -> QuantPart:
    elems, nbytes = BLOCKS[qtype]
    nb = rows * cols // elems
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:       # finite scales of a realistic size
        raw[:, off:off + 2] = (rng.uniform(0.002, 0.05, nb).astype(np.float16)
                               * rng.choice([-1, 1], nb).astype(np.float16)).view(np.uint8).reshape(nb, 2)
    data = torch.from_numpy(raw.reshape(rows, cols // elems * nbytes).copy())
    return QuantPart(data, qtype, cols)


def ref_weights(part: QuantPart) -> np.ndarray:
    return dequantize(part.data.numpy(), GGMLQuantizationType(part.qtype)).astype(np.float64)


def ref_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's q8 activation blocks of 32 (float32 arithmetic): (quants, scales)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    am = np.abs(b).max(-1)
    d = (am / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(am > 0, np.float32(127) / am, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv[..., None]).astype(np.float64)
    return q, d.astype(np.float64)


def assert_within_rounding_bound(y: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """y against the unquantized float64 product: each activation moves by at most half its
    block's scale when quantized, so |y - x w^T| <= sum over blocks of d/2 * sum |w|."""
    _, d = ref_quantize(x)
    bound = (np.abs(w).reshape(w.shape[0], -1, 32).sum(-1) @ (d / 2).T).T
    err = np.abs(y - x.astype(np.float64) @ w.T)
    assert np.all(err <= bound * 1.001 + 1e-4), f"outside the q8 rounding bound: {err.max()}"


def assert_matches_quantized_product(y: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """y against the quantized activations' product in float64 (llama.cpp's q8 blocks of
    x times the weights w [N, K]), to float32 rounding of its terms."""
    q, d = ref_quantize(x)
    wb = w.reshape(w.shape[0], -1, 32)
    qref = np.einsum("mbk,nbk,mb->mn", q, wb, d)
    scale = np.einsum("mbk,nbk,mb->mn", np.abs(q), np.abs(wb), d)
    np.testing.assert_array_less(np.abs(y - qref), 2e-6 * scale + 1e-6)
