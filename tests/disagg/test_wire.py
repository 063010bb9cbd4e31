"""The KV stream's format: a payload survives encode -> decode bit for bit, chunked at any
boundary and framed in any runs of pages with the layers interleaved in any order (as a
prefill worker sends them, layer by layer and chunk by chunk); every damaged or foreign
stream is `TransferFailed` (a recompute), never a payload. No processes: the stream is fed
from memory."""
from __future__ import annotations

import asyncio
import os
import random
import struct

import pytest
import torch

from mimo.disagg import wire
from mimo.kvcache.kv_frames import KVFrame
from mimo.kvcache.kv_payload import KVPayload
from mimo.kvcache.pool.layout import KVLayout, LayerKV

LAYOUT = KVLayout(full=(LayerKV(2, 4, 4),), swa=(LayerKV(1, 4, 2), LayerKV(1, 4, 2)),
                  window=8, dtype_bytes=4)
P, N = 4, 23
SEEDS = range(3) if os.environ.get("CI") else range(20)


def _payload(seed: int = 0) -> KVPayload:
    p = KVPayload.empty(LAYOUT, N, P, torch.float32)
    g = torch.Generator().manual_seed(seed)
    for k, v in p.full + p.swa:
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
    return p


def _stream(p: KVPayload, fp: str = "fp") -> bytes:
    return b"".join(wire.encode(7, 3, p, fp))


def _frames(p: KVPayload, seed: int) -> list[KVFrame]:
    """Each layer cut into random runs of pages, the layers interleaved at random, every
    layer's runs in order."""
    rnd = random.Random(seed)
    runs = []
    for j, (k, v) in enumerate(p.full + p.swa):
        pages, at, mine = k.shape[0] // P, 0, []
        while at < pages:
            n = rnd.randint(1, pages - at)
            mine.append(KVFrame(j, at, n, k[at * P:(at + n) * P], v[at * P:(at + n) * P]))
            at += n
        runs.append(mine)
    out = []
    while any(runs):
        out.append(rnd.choice([r for r in runs if r]).pop(0))
    return out


def _framed(frames: list[KVFrame], total: int, fp: str = "fp") -> bytes:
    head = wire.header(LAYOUT, N, P, "float32", fp)
    body = b"".join(bytes(c) for f in frames for c in wire.frame_chunks(f))
    return head + body + wire.trailer(7, 3, total)


async def _chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def _decode(data: bytes, size: int = 1000, fp: str = "fp", tokens: int = N):
    return asyncio.run(wire.decode(_chunks(data, size), fp, LAYOUT, P, tokens))


def _same(a: KVPayload, b: KVPayload) -> bool:
    return all(torch.equal(k, k2) and torch.equal(v, v2)
               for (k, v), (k2, v2) in zip(a.full + a.swa, b.full + b.swa, strict=True))


@pytest.mark.parametrize("size", [1, 7, 1000, 1 << 20])
def test_round_trip_is_exact_at_any_chunking(size):
    p = _payload()
    data = _stream(p)
    got = _decode(data, size)
    assert (got.first_token, got.cached_tokens, got.wire_bytes) == (7, 3, len(data))
    assert (got.payload.tokens, got.payload.swa_first_page) == (N, (N - 8) // P)
    assert _same(p, got.payload)
    assert got.payload.nbytes == p.nbytes and 0 < len(data) - p.nbytes < 1024


@pytest.mark.parametrize("seed", SEEDS)
def test_any_framing_and_interleaving_round_trips(seed):
    p = _payload(seed)
    frames = _frames(p, seed)
    data = _framed(frames, p.nbytes)
    got = _decode(data, random.Random(seed).choice([3, 64, 1 << 20]))
    assert _same(p, got.payload) and got.wire_bytes == len(data)
    # the bytes beyond the tensors: header, 12 per frame, 20 of trailer
    head = len(wire.header(LAYOUT, N, P, "float32", "fp"))
    assert len(data) - p.nbytes == head + 12 * len(frames) + 20


def test_damaged_or_foreign_streams_fail():
    p = _payload(1)
    data = _stream(p)
    head = len(wire.MAGIC) + 4 + struct.unpack("<I", data[8:12])[0]
    frames = _frames(p, 5)
    assert len(frames) > 3
    first = frames[0]
    later = next(f for f in frames if f.layer == first.layer and f.first_page > 0) \
        if any(f.layer == first.layer and f.first_page > 0 for f in frames) else None
    bad = {
        "truncated in a frame": data[:head + 100],
        "truncated before the trailer": data[:-20],
        "trailing bytes": data + b"x",
        "not a stream": b"HTTP/1.1" + data[8:],
        "the previous format": b"MIMOKV1\n" + data[8:],
        "frame of no layer": data[:head] + struct.pack("<I", 5) + data[head + 4:],
        "a frame leaving a gap": data[:head + 4] + struct.pack("<I", 1)
        + data[head + 8:],
        "wrong trailer count": data[:-8] + struct.pack("<Q", p.nbytes + 1),
        "huge header": wire.MAGIC + struct.pack("<I", 1 << 30),
        "a frame missing": _framed(frames[1:], p.nbytes),
        "a frame twice": _framed(frames[:1] + frames, p.nbytes),
        "frames out of order": _framed(frames[::-1], p.nbytes),
    }
    if later is not None:
        bad["a layer's pages out of order"] = _framed(
            [later] + [f for f in frames if f is not later], p.nbytes)
    for what, stream in bad.items():
        with pytest.raises(wire.TransferFailed):
            _decode(stream)
            pytest.fail(f"{what}: decoded")
    with pytest.raises(wire.TransferFailed):
        _decode(data, fp="another model")
    with pytest.raises(wire.TransferFailed):     # a stream for another prompt length
        _decode(data, tokens=N + 1)
