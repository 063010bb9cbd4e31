"""A GGUF file read in one pass: metadata and the tensor table, with tensor data mapped.

`gguf.GGUFReader` builds Python objects for every array element of the metadata (the 262k-token
vocabulary) and takes ~10 s on the default model; this reader takes well under a second.
Dequantization runs in torch, bit-identical to the `gguf` package (gguf_dequant.py).
"""
from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import torch

from . import gguf_dequant

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
# Metadata arrays longer than this stay as their stored bytes until an element is read
# (`GGUFArray`); shorter ones (a model's per-layer values) are plain lists.
LAZY_ITEMS = 4096


class GGUFArray(Sequence):
    """A long metadata array (a tokenizer's tokens, scores, token types) as the bytes the
    file stores, decoded the first time an element is read. A start whose tokenizer comes
    from the cache (tokenizer_cache.py, keyed by `stored()`) reads none of them: decoding the
    262k-token vocabulary and its numbers into Python objects took ~0.12 s of each start."""

    def __init__(self, item: int, count: int, data: bytes):
        self.item, self._count, self._data = item, count, data
        self._items: list | None = None

    def stored(self) -> bytes:
        """The element type and count, then the elements' bytes as the file stores them."""
        return struct.pack("<IQ", self.item, self._count) + self._data

    def _list(self) -> list:
        if self._items is None:
            self._items = _items(self._data, self.item, self._count, 0, "")[0]
        return self._items

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list: ...

    def __getitem__(self, i):
        return self._list()[i]

    def __iter__(self) -> Iterator:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFArray):
            return self.stored() == other.stored()
        return isinstance(other, (list, tuple)) and self._list() == list(other)

    def __repr__(self) -> str:
        return f"GGUFArray(type {self.item}, {self._count} items)"


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]      # row-major (numpy/torch order: reversed ggml dims)
    qtype: int
    offset: int                 # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        with open(self.path, "rb") as f:
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._data: tuple[int, torch.Tensor] | None = None     # (file offset, bytes): copy_data
        try:
            self.metadata, pos = _read_metadata(self._buf, self.path)
            self.tensors = self._read_tensor_table(pos)
        except (struct.error, UnicodeDecodeError, IndexError) as e:
            raise ValueError(f"{self.path}: truncated or corrupt GGUF file ({e})") from e

    def _read_tensor_table(self, pos: int) -> dict[str, GGUFTensor]:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        buf = self._buf
        (n_tensors,) = struct.unpack_from("<Q", buf, 8)
        raw = []
        for _ in range(n_tensors):
            name, pos = _string(buf, pos)
            (nd,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{nd}Q", buf, pos + 4)
            qtype, off = struct.unpack_from("<IQ", buf, pos + 4 + 8 * nd)
            pos += 4 + 8 * nd + 12
            raw.append((name, dims, qtype, off))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (pos + align - 1) // align * align
        out = {}
        for name, dims, qtype, off in raw:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
            n = int(np.prod(dims))
            t = GGUFTensor(name, tuple(int(d) for d in reversed(dims)), qtype,
                           data_start + off, n // block * type_size)
            if t.offset + t.nbytes > len(buf):
                raise ValueError(f"{self.path}: tensor {name} lies past the end of the file")
            out[name] = t
        return out

    def copy_data(self) -> None:
        """Copy every tensor's bytes out of the file at once. One numpy call, which releases
        the GIL throughout: it can run on a thread beside work that holds the GIL (the
        tokenizer's load). `raw` then returns views of this copy."""
        if not self.tensors:
            return
        start = min(t.offset for t in self.tensors.values())
        end = max(t.offset + t.nbytes for t in self.tensors.values())
        data = np.frombuffer(self._buf, dtype=np.uint8, count=end - start, offset=start).copy()
        self._data = (start, torch.from_numpy(data))

    def raw(self, t: GGUFTensor) -> torch.Tensor:
        """The tensor's bytes as stored, uint8 [rows, bytes per row]: a view of
        `copy_data`'s copy if it ran, else a copy of its own."""
        rows = int(np.prod(t.shape[:-1]))
        if self._data is not None:
            start, copied = self._data
            return copied[t.offset - start:t.offset - start + t.nbytes].view(rows, -1)
        data = np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return torch.from_numpy(data.copy()).view(rows, -1)

    def dequantize(self, t: GGUFTensor, dtype: torch.dtype = torch.float32,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """`dtype` tensor of `t.shape` (written to `out` if given): the `gguf` package's
        float32 values, cast as `.to` casts (gguf_dequant.py)."""
        data = np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return gguf_dequant.dequantize(data, t.qtype, t.shape, dtype, out)

    def mapped(self) -> mmap.mmap:
        """The file's read-only mapping, for views that go before `close`."""
        return self._buf

    def close(self) -> None:
        self._buf.close()


def _string(buf, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"), pos + 8 + n


def _value(buf, kind: int, pos: int, path: str) -> tuple[Any, int]:
    if kind in _SCALARS:
        return struct.unpack_from(_SCALARS[kind], buf, pos)[0], pos + struct.calcsize(_SCALARS[kind])
    if kind == 8:
        return _string(buf, pos)
    if kind != 9:
        raise ValueError(f"{path}: unknown GGUF metadata type {kind}")
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if count > LAZY_ITEMS and (item in _SCALARS or item == 8):
        end = pos + count * struct.calcsize(_SCALARS[item]) if item in _SCALARS \
            else _strings_end(buf, pos, count)
        if end > len(buf):
            raise IndexError("array past the end of the file")
        return GGUFArray(item, count, bytes(buf[pos:end])), end
    return _items(buf, item, count, pos, path)


def _strings_end(buf, pos: int, count: int) -> int:
    """Where `count` stored strings from `pos` end (their lengths only are read)."""
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        pos += 8 + unpack(buf, pos)[0]
    return pos


def _items(buf, item: int, count: int, pos: int, path: str) -> tuple[list, int]:
    """`count` elements of type `item` from `pos` -> (list, the position after them)."""
    if item in _SCALARS:
        fmt = f"<{count}{_SCALARS[item][1]}"
        return list(struct.unpack_from(fmt, buf, pos)), pos + struct.calcsize(fmt)
    items = []
    if item == 8:   # the vocabulary: inlined, this loop is most of its decoding time
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            (n,) = unpack(buf, pos)
            items.append(buf[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        return items, pos
    for _ in range(count):
        v, pos = _value(buf, item, pos, path)
        items.append(v)
    return items, pos


def _read_metadata(buf, path: str) -> tuple[dict[str, Any], int]:
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (bad magic bytes)")
    version, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (need 2 or 3)")
    pos, out = 24, {}
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        out[key], pos = _value(buf, kind, pos + 4, path)
    return out, pos


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The key/value section only."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _read_metadata(buf, str(path))[0]
