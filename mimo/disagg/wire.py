"""The KV stream between a prefill and a decode worker: binary tensors in frames, each a run
of pages of one layer, sent as soon as the prefill worker has them.

    MAGIC (8 bytes) | u32 n | header JSON (n bytes)
    | frames: u32 layer | u32 first page | u32 pages | K bytes | V bytes
    | u32 END | u32 first token | u32 cached tokens | u64 payload bytes

The header names the prompt length, paging, dtype and every layer's K/V shapes (full layers
first, then SWA layers: each holds only its window); it goes out before the prompt is
computed. A layer's frames cover its pages in order without gaps (pages counted from the
layer's first payload page); frames of different layers interleave freely (the prefill
worker sends layer by layer, chunk by chunk: `engine/kv_export.py`). The first token and
the prefill's cache hits are known only at the end: they travel in the trailer. Frame sizes
follow from the shapes, so a frame is raw tensor bytes after its 12-byte head. The decode
side allocates the payload's host buffers when the header arrives (its reservation) and
fills each frame's pages as its bytes arrive; a stream that ends early, carries a frame out
of order or of the wrong size, or whose trailer does not match is a failed transfer
(`TransferFailed`). `VERSION` is the format's number: the decode worker sends it with its
request and a prefill worker speaking another answers 409 before any byte of KV.
"""
from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import torch

from ..kvcache.kv_frames import KVFrame
from ..kvcache.kv_payload import KVPayload, payload_shapes
from ..kvcache.pool.layout import KVLayout

VERSION = 2
MAGIC = b"MIMOKV2\n"
END = 0xFFFFFFFF
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_HEADER = 1 << 20
FRAME = struct.Struct("<III")       # layer, first page, pages
TRAILER = struct.Struct("<IIIQ")    # END, first token, cached tokens, payload bytes


class TransferFailed(Exception):
    """The KV did not arrive whole (connection lost, timeout, malformed stream, refused)."""


@dataclass
class Prefilled:
    """What a prefill worker sends back for one request."""
    first_token: int
    cached_tokens: int          # prompt tokens the prefill worker reused from its cache
    payload: KVPayload
    wire_bytes: int = 0         # bytes of the stream as received


def dtype_name(t: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == t)


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, not copied (the view keeps the tensor alive)."""
    return t.contiguous().view(torch.uint8).numpy().data.cast("B")


def header(layout: KVLayout, tokens: int, page_size: int, dtype: str, fingerprint: str
           ) -> bytes:
    """The stream's opening: magic, then the shapes of a `tokens`-position payload."""
    first, full, swa = payload_shapes(layout, tokens, page_size)
    return _header(tokens, page_size, first, full, swa, dtype, fingerprint)


def _header(tokens: int, page_size: int, first: int, full: list, swa: list, dtype: str,
            fingerprint: str) -> bytes:
    h = json.dumps({"tokens": tokens, "page_size": page_size, "swa_first_page": first,
                    "dtype": dtype, "fingerprint": fingerprint,
                    "full": [[list(k), list(v)] for k, v in full],
                    "swa": [[list(k), list(v)] for k, v in swa]}).encode()
    return MAGIC + struct.pack("<I", len(h)) + h


def frame_chunks(f: KVFrame) -> tuple[bytes, memoryview, memoryview]:
    """A frame as three chunks: its head, then views of its K and V (the socket copies
    them once, nothing here does). The frame's bytes must be in host memory (`f.wait()`)."""
    return FRAME.pack(f.layer, f.first_page, f.pages), _raw(f.k), _raw(f.v)


def trailer(first_token: int, cached_tokens: int, payload_bytes: int) -> bytes:
    return TRAILER.pack(END, first_token, cached_tokens, payload_bytes)


def encode(first_token: int, cached_tokens: int, payload: KVPayload, fingerprint: str
           ) -> Iterator[bytes | memoryview]:
    """A whole payload as one stream, one frame per layer (benches and tests; a prefill
    worker sends frames as its engine makes them)."""
    layers = payload.full + payload.swa
    dtype = layers[0][0].dtype if layers else torch.float32
    yield _header(payload.tokens, payload.page_size, payload.swa_first_page,
                  [(k.shape, v.shape) for k, v in payload.full],
                  [(k.shape, v.shape) for k, v in payload.swa], dtype_name(dtype), fingerprint)
    for i, (k, v) in enumerate(layers):
        yield from frame_chunks(KVFrame(i, 0, k.shape[0] // payload.page_size, k, v))
    yield trailer(first_token, cached_tokens, payload.nbytes)


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
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise TransferFailed(f"malformed KV stream header: {e!r}") from None
    first, cached = await _frames(r, payload)
    return Prefilled(first, cached, payload, r.received)


async def _frames(r: _Reader, payload: KVPayload) -> tuple[int, int]:
    """Read frames into `payload` up to the trailer; (first token, cached tokens)."""
    layers = payload.full + payload.swa
    P = payload.page_size
    filled = [0] * len(layers)
    while True:
        layer, a, b = FRAME.unpack(await r.read(FRAME.size))
        if layer == END:        # the trailer: END, first token, cached tokens, bytes
            first, cached = a, b
            break
        if layer >= len(layers):
            raise TransferFailed(f"KV frame for layer {layer} of {len(layers)}")
        k, v = layers[layer]
        if a != filled[layer] or b < 1 or (a + b) * P > k.shape[0]:
            raise TransferFailed(f"KV frame of layer {layer}: pages {a}+{b} after "
                                 f"{filled[layer]} of {k.shape[0] // P}")
        await r.read_into(k[a * P:(a + b) * P])
        await r.read_into(v[a * P:(a + b) * P])
        filled[layer] += b
    (total,) = struct.unpack("<Q", await r.read(8))
    if filled != [k.shape[0] // P for k, _ in layers] or total != payload.nbytes \
            or not await r.at_end():
        raise TransferFailed("KV stream trailer does not match what arrived")
    return first, cached
