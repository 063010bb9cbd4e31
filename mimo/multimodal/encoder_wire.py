"""What travels between a worker and a remote encoder (`--role encoder`): tensors as raw
bytes in one framed body, never JSON numbers.

    MAGIC (8 bytes) | u32 n | header JSON (n bytes) | tensor bytes | u32 CRC32 of all before

Request (MAGIC_REQ, POST /v1/internal/encode, application/x-mimo-tensors): header
{"fingerprint": the encoder the caller expects (`tower_fingerprint`), "items": [{"key":
cache key (media hash, processor settings, salt), "grid": [t, h, w], "dtype", "shape":
[patches, patch_dim]}]}; the tensor bytes are each item's pixel values, C order, in item
order. Response (MAGIC_RES): header {"fingerprint", "items": [{"dtype", "shape": [rows,
hidden], "hit": whether a cache served it}]} and each item's embeddings the same way.
Sizes follow from dtype and shape; a body whose length, CRC or shapes do not add up is
refused (`WireError`).

A probe (request header "probe": true, items without dtype and shape, no tensor bytes)
asks for cached embeddings only: the reply gives a hit's embeddings and an empty [0, 0]
tensor for a miss, whose pixels the caller then sends.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

import torch

MAGIC_REQ = b"MIMOENQ1"
MAGIC_RES = b"MIMOENR1"
CONTENT_TYPE = "application/x-mimo-tensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_HEADER = 4 << 20


class WireError(ValueError):
    """A body that is not a whole, well-formed encoder frame."""


@dataclass(frozen=True)
class EncodeItem:
    key: str
    grid: tuple[int, int, int]
    pixels: torch.Tensor | None     # [patches, patch_dim]; None in a probe


@dataclass(frozen=True)
class EncodeReply:
    fingerprint: str
    hit: list[bool]
    embeds: list[torch.Tensor]


def _name(dt: torch.dtype) -> str:
    for k, v in DTYPES.items():
        if v == dt:
            return k
    raise WireError(f"dtype {dt} cannot travel (one of {', '.join(DTYPES)})")


def _frame(magic: bytes, header: dict, tensors: list[torch.Tensor]) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    parts = [magic, struct.pack("<I", len(h)), h]
    parts += [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
              for t in tensors]
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def _unframe(magic: bytes, body: bytes) -> tuple[dict, memoryview]:
    if len(body) < 16 or body[:8] != magic:
        raise WireError("not an encoder frame (bad magic or too short)")
    (crc,) = struct.unpack_from("<I", body, len(body) - 4)
    if zlib.crc32(memoryview(body)[:-4]) != crc:
        raise WireError("encoder frame CRC mismatch (truncated or corrupt)")
    (n,) = struct.unpack_from("<I", body, 8)
    if n > MAX_HEADER or 12 + n > len(body) - 4:
        raise WireError("encoder frame header length out of range")
    try:
        header = json.loads(body[12:12 + n])
    except ValueError:
        raise WireError("encoder frame header is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("encoder frame header is not an object")
    return header, memoryview(body)[12 + n:-4]


def _tensors(specs: object, data: memoryview) -> list[torch.Tensor]:
    if not isinstance(specs, list):
        raise WireError("items must be a list")
    out, at = [], 0
    for i, s in enumerate(specs):
        try:
            dt = DTYPES[s["dtype"]]
            shape = tuple(int(x) for x in s["shape"])
        except (KeyError, TypeError, ValueError):
            raise WireError(f"item {i}: needs dtype (one of {', '.join(DTYPES)}) and shape"
                            ) from None
        if len(shape) != 2 or min(shape) < 0:
            raise WireError(f"item {i}: shape {shape} is not [rows, columns]")
        n = shape[0] * shape[1] * torch.empty(0, dtype=dt).element_size()
        if at + n > len(data):
            raise WireError(f"item {i}: its bytes run past the body")
        raw = bytearray(data[at:at + n])
        t = torch.frombuffer(raw, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
        out.append(t.view(dt).reshape(shape))
        at += n
    if at != len(data):
        raise WireError(f"{len(data) - at} bytes after the last item")
    return out


def encode_request(fingerprint: str, items: list[EncodeItem]) -> bytes:
    px = [it.pixels for it in items if it.pixels is not None]
    if len(px) != len(items):
        raise WireError("every item of an encode request carries pixels")
    header = {"fingerprint": fingerprint,
              "items": [{"key": it.key, "grid": list(it.grid), "dtype": _name(p.dtype),
                         "shape": list(p.shape)} for it, p in zip(items, px)]}
    return _frame(MAGIC_REQ, header, px)


def encode_probe(fingerprint: str, items: list[tuple[str, tuple[int, int, int]]]) -> bytes:
    """(key, grid) per item: what the encoder's cache holds of them."""
    header = {"fingerprint": fingerprint, "probe": True,
              "items": [{"key": k, "grid": list(g)} for k, g in items]}
    return _frame(MAGIC_REQ, header, [])


def decode_request(body: bytes) -> tuple[str, list[EncodeItem]]:
    header, data = _unframe(MAGIC_REQ, body)
    fp, specs = header.get("fingerprint"), header.get("items")
    if not isinstance(fp, str) or not isinstance(specs, list) or not specs:
        raise WireError("the header needs fingerprint (a string) and items (a non-empty list)")
    probe = header.get("probe", False)
    if not isinstance(probe, bool):
        raise WireError("probe must be a boolean")
    if probe and len(data):
        raise WireError("a probe carries no tensor bytes")
    tensors: list = [None] * len(specs) if probe else _tensors(specs, data)
    items = []
    for i, (s, px) in enumerate(zip(specs, tensors)):
        if not isinstance(s, dict):
            raise WireError(f"item {i} is not an object")
        key, grid = s.get("key"), s.get("grid")
        if not isinstance(key, str) or not key:
            raise WireError(f"item {i}: key must be a non-empty string")
        if not (isinstance(grid, list) and len(grid) == 3
                and all(isinstance(g, int) and not isinstance(g, bool) for g in grid)):
            raise WireError(f"item {i}: grid must be [t, h, w] integers")
        items.append(EncodeItem(key, (grid[0], grid[1], grid[2]), px))
    return fp, items


def encode_reply(reply: EncodeReply) -> bytes:
    header = {"fingerprint": reply.fingerprint,
              "items": [{"dtype": _name(e.dtype), "shape": list(e.shape), "hit": bool(h)}
                        for e, h in zip(reply.embeds, reply.hit)]}
    return _frame(MAGIC_RES, header, reply.embeds)


def decode_reply(body: bytes) -> EncodeReply:
    header, data = _unframe(MAGIC_RES, body)
    fp, specs = header.get("fingerprint"), header.get("items")
    if not isinstance(fp, str) or not isinstance(specs, list):
        raise WireError("the reply header needs fingerprint and items")
    hit = [s.get("hit") if isinstance(s, dict) else None for s in specs]
    if not all(isinstance(h, bool) for h in hit):
        raise WireError("every reply item needs hit (a boolean)")
    return EncodeReply(fp, [h is True for h in hit], _tensors(specs, data))
