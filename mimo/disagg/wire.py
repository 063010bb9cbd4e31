"""The KV stream between a prefill and a decode worker: binary tensors, one frame per layer.

    MAGIC (8 bytes) | u32 n | header JSON (n bytes) | per layer: u32 index | K bytes | V bytes
    | u32 END | u64 payload bytes

The header names the request's prompt length, first token, cached tokens, paging, dtype and
every layer's K/V shapes (full layers first, then SWA layers: each holds only its window).
Frame sizes follow from the shapes, so a frame is raw tensor bytes with no per-frame
encoding. The decode side allocates the payload's host buffers when the header arrives (its
reservation) and fills each layer as its bytes arrive; a stream that ends early, carries a
wrong index or a wrong byte count is a failed transfer (`TransferFailed`).
"""
from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import torch

from ..kvcache.kv_payload import KVPayload, payload_shapes
from ..kvcache.pool.layout import KVLayout

MAGIC = b"MIMOKV1\n"
END = 0xFFFFFFFF
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_HEADER = 1 << 20


class TransferFailed(Exception):
    """The KV did not arrive whole (connection lost, timeout, malformed stream, refused)."""


@dataclass
class Prefilled:
    """What a prefill worker sends back for one request."""
    first_token: int
    cached_tokens: int          # prompt tokens the prefill worker reused from its cache
    payload: KVPayload
    wire_bytes: int = 0         # bytes of the stream as received


def _dtype_name(t: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == t)


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, not copied (the view keeps the tensor alive)."""
    return t.contiguous().view(torch.uint8).numpy().data.cast("B")


def encode(first_token: int, cached_tokens: int, payload: KVPayload,
           fingerprint: str) -> Iterator[bytes | memoryview]:
    """The stream's chunks: the header, then each layer's frame as three chunks (its index,
    then views of its K and V: the socket copies them once, nothing here does)."""
    layers = payload.full + payload.swa
    dtype = layers[0][0].dtype if layers else torch.float32
    header = {"tokens": payload.tokens, "page_size": payload.page_size,
              "swa_first_page": payload.swa_first_page, "first_token": first_token,
              "cached_tokens": cached_tokens, "dtype": _dtype_name(dtype),
              "fingerprint": fingerprint,
              "full": [[list(k.shape), list(v.shape)] for k, v in payload.full],
              "swa": [[list(k.shape), list(v.shape)] for k, v in payload.swa]}
    h = json.dumps(header).encode()
    yield MAGIC + struct.pack("<I", len(h)) + h
    for i, (k, v) in enumerate(layers):
        yield struct.pack("<I", i)
        yield _raw(k)
        yield _raw(v)
    yield struct.pack("<IQ", END, payload.nbytes)


class _Reader:
    """Exact reads over an async iterator of byte chunks; counts every byte received."""

    def __init__(self, chunks: AsyncIterator[bytes | memoryview]):
        self._it = chunks.__aiter__()
        self._buf = bytearray()
        self.received = 0

    async def read(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                chunk = await self._it.__anext__()
            except StopAsyncIteration:
                raise TransferFailed(f"KV stream ended early ({self.received} bytes)") from None
            self.received += len(chunk)
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def read_into(self, t: torch.Tensor) -> None:
        """Fill host tensor `t` with its byte size of the stream, copying each chunk once,
        straight into the tensor (no intermediate buffers: they cost more than the socket)."""
        dst = t.view(torch.uint8).reshape(-1).numpy().data
        n, off = len(dst), 0
        if self._buf:
            off = min(n, len(self._buf))
            dst[:off] = self._buf[:off]
            del self._buf[:off]
        while off < n:
            try:
                chunk = memoryview(await self._it.__anext__()).cast("B")
            except StopAsyncIteration:
                raise TransferFailed(f"KV stream ended early ({self.received} bytes)") from None
            self.received += len(chunk)
            take = min(n - off, len(chunk))
            dst[off:off + take] = chunk[:take]
            off += take
            if take < len(chunk):
                self._buf += chunk[take:]

    async def at_end(self) -> bool:
        if self._buf:
            return False
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            return True
        self._buf += chunk
        self.received += len(chunk)
        return not chunk


def _shapes(header: dict, kind: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return [(tuple(k), tuple(v)) for k, v in header[kind]]


async def decode(chunks: AsyncIterator[bytes | memoryview], fingerprint: str, layout: KVLayout,
                 page_size: int, tokens: int) -> Prefilled:
    """Read one stream for a prompt of `tokens` into host buffers allocated once its header
    matches what this worker's pools (`layout`, `page_size`) would hold."""
    r = _Reader(chunks)
    if await r.read(len(MAGIC)) != MAGIC:
        raise TransferFailed("not a mimo KV stream")
    (n,) = struct.unpack("<I", await r.read(4))
    if n > MAX_HEADER:
        raise TransferFailed(f"KV stream header of {n} bytes")
    try:
        h = json.loads(await r.read(n))
        if h["fingerprint"] != fingerprint:
            raise TransferFailed("the prefill worker's model or KV layout differs from ours")
        dtype = DTYPES[h["dtype"]]
        full, swa = _shapes(h, "full"), _shapes(h, "swa")
        want = payload_shapes(layout, tokens, page_size)
        if (int(h["tokens"]), int(h["page_size"]), int(h["swa_first_page"]), full, swa) != \
                (tokens, page_size, *want):
            raise TransferFailed("the KV stream's shapes are not this prompt's in our pools")
        payload = KVPayload(int(h["tokens"]), int(h["page_size"]), int(h["swa_first_page"]),
                            [(torch.empty(k, dtype=dtype), torch.empty(v, dtype=dtype))
                             for k, v in full],
                            [(torch.empty(k, dtype=dtype), torch.empty(v, dtype=dtype))
                             for k, v in swa])
        first, cached = int(h["first_token"]), int(h["cached_tokens"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise TransferFailed(f"malformed KV stream header: {e!r}") from None
    for i, (k, v) in enumerate(payload.full + payload.swa):
        (idx,) = struct.unpack("<I", await r.read(4))
        if idx != i:
            raise TransferFailed(f"KV frame {idx} where frame {i} was due")
        await r.read_into(k)
        await r.read_into(v)
    end, total = struct.unpack("<IQ", await r.read(12))
    if end != END or total != payload.nbytes or not await r.at_end():
        raise TransferFailed("KV stream trailer does not match what arrived")
    return Prefilled(first, cached, payload, r.received)
