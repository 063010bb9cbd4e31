"""GGUF blocks -> dense weights in the model's dtype, in torch.

Each decoder below is the `gguf` package's numpy `dequantize_blocks` of that type, op for op
(float32 products and differences in the same order, no fused multiply-add), so its float32
result is bit-identical to the package's; tests/models/test_gguf_dequant.py holds it to that
on random blocks of every type. It runs over slices of blocks small enough that the
temporaries stay in cache, and each slice is cast straight into the output: a bfloat16
model never holds the float32 copy (the cast is torch's `.to`, as the model's own was).
Types without a decoder here go through the package, then the same cast.

A whole model's worth is thousands of small ops: `one_thread()` runs them on one intra-op
thread. With two, each op's parallel region waits for the second thread, which on a busy
2-core machine spins for whole scheduler slices: measured 15-25x the CPU time of one.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch

# GGMLQuantizationType values
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
# Output elements decoded per slice: float32 temporaries of ~1 MiB each.
SLICE = 1 << 18


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes per row -> their little-endian fp16 as float32 [n, 1]."""
    return b.contiguous().view(torch.float16).float()


def _shifts(*s: int) -> torch.Tensor:
    return torch.tensor(s, dtype=torch.uint8)


def _nibbles(qs: torch.Tensor, n: int, group: int) -> torch.Tensor:
    """Low then high nibbles of each `group` bytes: [n, groups * 2, group]."""
    return (qs.reshape(n, -1, 1, group) >> _shifts(0, 4).reshape(1, 1, 2, 1)) & 0x0F


def _bits(qh: torch.Tensor, n: int) -> torch.Tensor:
    """Bit i of a little-endian bit string, i = 0..8*bytes-1, as uint8 [n, 8 * bytes]."""
    return ((qh.reshape(n, -1, 1) >> torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8)) & 1
            ).reshape(n, -1)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    q = _nibbles(b[:, 2:], n, 16).reshape(n, -1).to(torch.int8) - 8
    return _f16(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    q = _nibbles(b[:, 4:], n, 16).reshape(n, -1).float()
    return _f16(b[:, :2]) * q + _f16(b[:, 2:4])


def _q5(b: torch.Tensor, lo: int) -> torch.Tensor:
    """Q5_0 / Q5_1's 5-bit values: 32 high bits at lo-4..lo, nibbles from lo."""
    n = b.shape[0]
    return _nibbles(b[:, lo:], n, 16).reshape(n, -1) | (_bits(b[:, lo - 4:lo], n) << 4)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * (_q5(b, 6).to(torch.int8) - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * _q5(b, 8).float() + _f16(b[:, 2:4])


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].view(torch.int8).float() * _f16(b[:, :2])


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n, scales = b.shape[0], b[:, :16]
    dl = (_f16(b[:, 80:82]) * (scales & 0x0F).float()).reshape(n, 16, 1)
    ml = (_f16(b[:, 82:84]) * (scales >> 4).float()).reshape(n, 16, 1)
    q = (b[:, 16:80].reshape(n, -1, 1, 32) >> _shifts(0, 2, 4, 6).reshape(1, 1, 4, 1)) & 3
    return (dl * q.reshape(n, 16, 16).float() - ml).reshape(n, 256)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n, scales = b.shape[0], b[:, 96:108]
    lo = (scales[:, :8].reshape(n, 1, 8) >> _shifts(0, 4).reshape(1, 2, 1)).reshape(n, 16)
    hi = (scales[:, 8:].reshape(n, 1, 4) >> _shifts(0, 2, 4, 6).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((lo & 0x0F) | ((hi & 0x03) << 4)).to(torch.int8) - 32
    dl = (_f16(b[:, 108:110]) * sc.float()).reshape(n, 16, 1)
    ql = (b[:, 32:96].reshape(n, -1, 1, 32) >> _shifts(0, 2, 4, 6).reshape(1, 1, 4, 1))
    ql = ql.reshape(n, 16, 16) & 3
    qh = (_bits_rows(b[:, :32], n).reshape(n, 16, 16) & 1) ^ 1   # offset 4 where the bit is 0
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float()
    return (dl * q).reshape(n, 256)


def _bits_rows(qh: torch.Tensor, n: int) -> torch.Tensor:
    """The K-quants' high bits: bit j of all 32 bytes, for j = 0..7, as [n, 8, 32]."""
    return qh.reshape(n, -1, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8, 1)


def _k_scales(s: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> ([n, 8], [n, 8]) uint8."""
    s = s.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], -1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], -1)
    return sc, mn


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16], n)
    dl = (_f16(b[:, :2]) * sc.float()).reshape(n, -1, 1)
    ml = (_f16(b[:, 2:4]) * mn.float()).reshape(n, -1, 1)
    q = _nibbles(b[:, 16:], n, 32).reshape(n, -1, 32).float()
    return (dl * q - ml).reshape(n, 256)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16], n)
    dl = (_f16(b[:, :2]) * sc.float()).reshape(n, -1, 1)
    ml = (_f16(b[:, 2:4]) * mn.float()).reshape(n, -1, 1)
    ql = _nibbles(b[:, 48:], n, 32).reshape(n, -1, 32)
    qh = (_bits_rows(b[:, 16:48], n) & 1).reshape(n, -1, 32)
    return (dl * (ql | (qh << 4)).float() - ml).reshape(n, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    dl = (_f16(b[:, 208:210]) * b[:, 192:208].view(torch.int8).float()).reshape(n, 16, 1)
    ql = _nibbles(b[:, :128], n, 64).reshape(n, -1, 32)
    qh = (b[:, 128:192].reshape(n, -1, 1, 32) >> _shifts(0, 2, 4, 6).reshape(1, 1, 4, 1)) & 3
    q = (ql | (qh.reshape(n, -1, 32) << 4)).to(torch.int8) - 32
    return (dl * q.reshape(n, 16, 16).float()).reshape(n, 256)


def _f16_values(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16_values(b: torch.Tensor) -> torch.Tensor:
    # the package shifts the 16 bits into a float32's top half; torch's bf16 -> fp32 does too
    return b.contiguous().view(torch.bfloat16).float()


# type -> (elements per block, bytes per block, decoder of [n, bytes] uint8 -> [n, elements])
DECODERS: dict[int, tuple[int, int, Callable[[torch.Tensor], torch.Tensor]]] = {
    F16: (1, 2, _f16_values), BF16: (1, 2, _bf16_values),
    Q4_0: (32, 18, _q4_0), Q4_1: (32, 20, _q4_1), Q5_0: (32, 22, _q5_0),
    Q5_1: (32, 24, _q5_1), Q8_0: (32, 34, _q8_0), Q2_K: (256, 84, _q2_k),
    Q3_K: (256, 110, _q3_k), Q4_K: (256, 144, _q4_k), Q5_K: (256, 176, _q5_k),
    Q6_K: (256, 210, _q6_k),
}


def dequantize(data: np.ndarray, qtype: int, shape: tuple[int, ...],
               dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """A tensor's bytes as stored (uint8, read-only is fine) -> `dtype` tensor of `shape`:
    the `gguf` package's float32 values, cast as `.to(dtype)` casts. `out`: a contiguous
    tensor of that shape and dtype to write them to (returned)."""
    if out is None:
        out = torch.empty(shape, dtype=dtype)
    elif tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {shape}")
    if qtype == F32:
        return out.copy_(torch.from_numpy(data.view(np.float32).copy()).reshape(shape))
    if qtype not in DECODERS:
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize as reference
        arr = reference(data.reshape(int(np.prod(shape[:-1])), -1), GGMLQuantizationType(qtype))
        return out.copy_(torch.from_numpy(np.array(arr, dtype=np.float32)).reshape(shape))
    elems, nbytes, decode = DECODERS[qtype]
    flat = out.view(-1)
    if flat.numel() % elems or data.size != flat.numel() // elems * nbytes:
        raise ValueError(f"{data.size} bytes are not {flat.numel()} elements of GGML type {qtype}")
    step = max(1, SLICE // elems)           # blocks per slice
    blocks = data.reshape(-1, nbytes)
    for a in range(0, blocks.shape[0], step):
        raw = torch.from_numpy(blocks[a:a + step].copy())
        flat[a * elems:(a + len(raw)) * elems].copy_(decode(raw).reshape(-1))
    return out


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to one inside, restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
