"""A weight matrix kept in a GGUF file's own quantized blocks, multiplied by the C++ kernels.

`QuantMatrix` is the row-wise concatenation of parts, each in its own GGML type (a fused
q/k/v projection whose parts the file stores as Q5_0, Q5_0 and Q8_0). Products quantize the
activations to 8 bits per block of 32 (llama.cpp's recipe) and take integer dot products
against the blocks as they are, so mimo computes with exactly the weights llama.cpp does.

Parts of a multiple of 8 rows may be repacked at start-up into 8-row tiles (type ids 106
"Q5_0x8", 108 "Q8_0x8", 112 "Q4_Kx8", 114 "Q6_Kx8": the same values, the bytes reordered and
Q4_K's scales unpacked; the layouts: mimo/cpu/csrc/qrepack.h), the types `repack_types`
names for the kernel build; `unpacked()` gives the GGUF blocks back.

Where the kernels cannot be loaded (`extension.load()` is None) the same product runs on
the plain PyTorch path: the blocks dequantized once (by the `gguf` package) to float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import extension

# GGML type ids the kernels take, with (elements, bytes) per block.
BLOCKS = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          12: (256, 144), 13: (256, 176), 14: (256, 210)}
NAMES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K",
         14: "Q6_K", 106: "Q5_0x8", 108: "Q8_0x8", 112: "Q4_Kx8", 114: "Q6_Kx8"}
# Not GGML's: a GGML type repacked 8 rows a tile, by the type it came from
REPACKED = {6: 106, 8: 108, 12: 112, 14: 114}
TILE_ROWS = 8         # weight rows per tile of a repacked layout (qrepack.h's ROWS)


def repack_types(kernels: str) -> frozenset[int]:
    """The GGML types the kernel build `kernels` (extension.label) multiplies faster in 8-row
    tiles than as stored (docs/cpu_kernels.md, "The layouts per build"):
    - avx2: all four; its tiles on the GGUF blocks gather and transpose every block;
    - avx512-vnni (no AMX tiles in use): Q5_0, Q4_K and Q6_K, 1.4-1.6x on one activation row
      and faster at 16, its prefill GEMM reading the tiles as well; Q8_0 stays as stored,
      where the 512-bit tiles read the tied head faster (3.3 against 4.2 ms a row);
    - avx512-vnni+amx: none; 16-row batches run on AMX-INT8 tiles over the GGUF blocks."""
    if kernels == "avx2":
        return frozenset(REPACKED)
    if kernels == "avx512-vnni":
        return frozenset({6, 12, 14})
    return frozenset()


# what a QuantPart holds
LAYOUTS = {**BLOCKS, 106: (32, 22), 108: (32, 34), 112: (256, 148), 114: (256, 210)}


@dataclass(frozen=True)
class QuantPart:
    """Rows of a weight in GGUF blocks: `data` uint8 [rows, row_bytes], `cols` elements a row."""
    data: torch.Tensor
    qtype: int
    cols: int

    def __post_init__(self) -> None:
        if self.qtype not in LAYOUTS:
            raise ValueError(f"GGML type {self.qtype} has no kernel "
                             f"(supported: {', '.join(NAMES.values())})")
        elems, nbytes = LAYOUTS[self.qtype]
        if self.cols % elems or self.data.dim() != 2 or self.data.dtype != torch.uint8 \
                or self.data.shape[1] != self.cols // elems * nbytes:
            raise ValueError(f"{NAMES[self.qtype]} blocks of shape {tuple(self.data.shape)} "
                             f"do not hold rows of {self.cols} elements")
        if self.qtype in REPACKED.values() and self.rows % TILE_ROWS:
            raise ValueError(f"{NAMES[self.qtype]} blocks need a multiple of 8 rows, "
                             f"not {self.rows}")

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    def repacked(self, ext, types: frozenset[int] = frozenset(REPACKED)) -> QuantPart:
        """This part in the repacked layout (by `ext`, a kernel build) where its type is one
        of `types` and its rows fill whole tiles; else itself."""
        if self.qtype in types and self.rows % TILE_ROWS == 0:
            return QuantPart(ext.repack_x8(self.data, self.qtype), REPACKED[self.qtype], self.cols)
        return self

    def unpacked(self) -> QuantPart:
        """This part in the GGUF's own blocks."""
        base = next((g for g, r in REPACKED.items() if r == self.qtype), None)
        if base is None:
            return self
        ext = extension.load()
        if ext is None:
            raise RuntimeError(f"{NAMES[self.qtype]} blocks are unpacked by the CPU kernels, "
                               "which did not load")
        return QuantPart(ext.unpack_x8(self.data, base), base, self.cols)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [rows, cols], by the `gguf` package (the plain reference)."""
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize
        if self.qtype in REPACKED.values():
            return self.unpacked().dequantize(rows)
        d = self.data if rows is None else self.data.index_select(0, rows)
        arr = dequantize(d.numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


def supported(qtype: int) -> bool:
    return qtype in BLOCKS


class QuantMatrix:
    """y = x @ W.T with W the parts stacked by rows."""

    def __init__(self, parts: list[QuantPart]):
        if not parts or len({p.cols for p in parts}) != 1:
            raise ValueError("a QuantMatrix needs parts with one row length")
        self.parts = parts
        self.shape = (sum(p.rows for p in parts), parts[0].cols)
        self._dense: torch.Tensor | None = None      # the fallback's float32 copy

    @property
    def nbytes(self) -> int:
        return sum(p.data.numel() for p in self.parts)

    def dense(self) -> torch.Tensor:
        if self._dense is None:
            self._dense = torch.cat([p.dequantize() for p in self.parts])
        return self._dense

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [..., N] for x [..., K] (any float dtype)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).float().contiguous()
        ext = extension.load()
        if ext is None:
            y = x2 @ self.dense().T
        else:     # more rows than a tile holds: the GEMM that decodes each tile once
            f = ext.qlinear if x2.shape[0] <= 16 else ext.qgemm
            y = f(x2, [p.data for p in self.parts], [p.qtype for p in self.parts])
        return y.reshape(*lead, self.shape[0])

    def select_rows(self, idx: torch.Tensor) -> QuantMatrix:
        """The rows `idx` of W: their products equal those columns of the full product."""
        if len(self.parts) != 1:
            raise ValueError("select_rows takes a single-part matrix")
        p = self.parts[0]
        if p.qtype in REPACKED.values():
            # only the tiles holding those rows are unpacked (a head is 262k rows)
            tile = idx // TILE_ROWS
            tiles = torch.unique(tile)
            rb = p.data.shape[1]
            held = QuantPart(p.data.view(-1, TILE_ROWS * rb).index_select(0, tiles).view(-1, rb),
                             p.qtype, p.cols).unpacked()
            idx = torch.searchsorted(tiles, tile) * TILE_ROWS + idx % TILE_ROWS
            p = held
        return QuantMatrix([QuantPart(p.data.index_select(0, idx), p.qtype, p.cols)])

    def repacked(self, ext, types: frozenset[int] = frozenset(REPACKED)) -> QuantMatrix:
        """The same matrix with the parts of `types` in the repacked layout."""
        return QuantMatrix([p.repacked(ext, types) for p in self.parts])

    def topk(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, columns) [M, k] of the k best columns of each row of x [M, K], best first,
        ties to the lower column; the [M, N] scores are never written by the kernels."""
        ext = extension.load()
        x2 = x.float().contiguous()
        if ext is None or len(self.parts) != 1:
            s = self.matmul(x2)
            # a stable descending sort puts equal scores in column order
            order = torch.sort(s, dim=1, descending=True, stable=True)
            return order.values[:, :k], order.indices[:, :k]
        p = self.parts[0]
        vals, idx = ext.qtopk(x2, p.data, p.qtype, k)
        return vals, idx
