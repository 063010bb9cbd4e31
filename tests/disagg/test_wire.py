"""The KV stream's format: a payload survives encode -> decode bit for bit, chunked at any
boundary; every damaged or foreign stream is `TransferFailed` (a recompute), never a
payload. No processes: the stream is fed from memory."""
from __future__ import annotations

import asyncio
import struct

import pytest
import torch

from mimo.disagg import wire
from mimo.kvcache.kv_payload import KVPayload
from mimo.kvcache.pool.layout import KVLayout, LayerKV

LAYOUT = KVLayout(full=(LayerKV(2, 4, 4),), swa=(LayerKV(1, 4, 2), LayerKV(1, 4, 2)),
                  window=8, dtype_bytes=4)
P, N = 4, 23


def _payload(seed: int = 0) -> KVPayload:
    p = KVPayload.empty(LAYOUT, N, P, torch.float32)
    g = torch.Generator().manual_seed(seed)
    for k, v in p.full + p.swa:
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
    return p


def _stream(p: KVPayload, fp: str = "fp") -> bytes:
    return b"".join(wire.encode(7, 3, p, fp))


async def _chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def _decode(data: bytes, size: int = 1000, fp: str = "fp", tokens: int = N):
    return asyncio.run(wire.decode(_chunks(data, size), fp, LAYOUT, P, tokens))


@pytest.mark.parametrize("size", [1, 7, 1000, 1 << 20])
def test_round_trip_is_exact_at_any_chunking(size):
    p = _payload()
    data = _stream(p)
    got = _decode(data, size)
    assert (got.first_token, got.cached_tokens, got.wire_bytes) == (7, 3, len(data))
    assert (got.payload.tokens, got.payload.swa_first_page) == (N, (N - 8) // P)
    for (k, v), (k2, v2) in zip(p.full + p.swa, got.payload.full + got.payload.swa):
        assert torch.equal(k, k2) and torch.equal(v, v2)
    assert got.payload.nbytes == p.nbytes and 0 < len(data) - p.nbytes < 1024


def test_damaged_or_foreign_streams_fail():
    p = _payload(1)
    data = _stream(p)
    head = len(wire.MAGIC) + 4 + struct.unpack("<I", data[8:12])[0]
    bad = {
        "truncated in a frame": data[:head + 100],
        "truncated before the trailer": data[:-12],
        "trailing bytes": data + b"x",
        "not a stream": b"HTTP/1.1" + data[8:],
        "wrong frame index": data[:head] + struct.pack("<I", 5) + data[head + 4:],
        "wrong trailer count": data[:-8] + struct.pack("<Q", p.nbytes + 1),
        "huge header": wire.MAGIC + struct.pack("<I", 1 << 30),
    }
    for what, stream in bad.items():
        with pytest.raises(wire.TransferFailed):
            _decode(stream)
            pytest.fail(f"{what}: decoded")
    with pytest.raises(wire.TransferFailed):
        _decode(data, fp="another model")
    with pytest.raises(wire.TransferFailed):     # a stream for another prompt length
        _decode(data, tokens=N + 1)
