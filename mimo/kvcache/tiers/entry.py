"""The format of one L3 entry: a 48-byte header, then the payload.

Header (little-endian): magic b"MIKV", format version (u16), header size (u16), a 16-byte hash
of the key, the payload length (u64), and two 64-bit checksums of the payload. The key hash
is a blake2b personalised for entries, independent of the one the file store names files by,
so an entry stored under the wrong name (or a file-name collision) fails the check.

The checksum is a Fletcher-style pair over the payload read as little-endian u64 words in
4 KiB blocks: s1 is the sum of all words, s2 the sum of the block sums weighted by block
position (both mod 2**64). s1 catches every single-bit flip and zeroed or torn ranges, s2
blocks moved or duplicated, the length field truncation. It runs at memory speed in numpy;
zlib.crc32, several times slower, would have bounded the L3 load throughput below what Redis
delivers. What it misses, words permuted inside one 4 KiB block, is not how storage corrupts
data.
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np

MAGIC = b"MIKV"
VERSION = 1
_HEADER = struct.Struct("<4sHH16sQQQ")
HEADER_SIZE = _HEADER.size          # 48: keeps the payload 16-byte aligned after the header
_BLOCK_WORDS = 512                  # 4 KiB blocks
_MASK64 = (1 << 64) - 1
_WEIGHTS = np.arange(1, (1 << 16) + 1, dtype="<u8")   # block positions, up to 256 MiB payloads

Buffer = bytes | bytearray | memoryview


class CorruptEntry(ValueError):
    """A stored blob is not a valid entry for its key. `delete` is False only for an entry of
    another format version: a newer writer's entry is not garbage, only unreadable here."""

    def __init__(self, reason: str, delete: bool = True):
        super().__init__(reason)
        self.reason = reason
        self.delete = delete


def key_hash(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=16, person=b"mimo-kv-entry").digest()


def checksum(payload: Buffer) -> tuple[int, int]:
    mv = memoryview(payload).cast("B")
    n_words = len(mv) // 8
    words = np.frombuffer(mv, dtype="<u8", count=n_words)
    n_full = n_words // _BLOCK_WORDS
    sums = np.empty(n_full + 1, dtype="<u8")
    # numpy reductions wrap mod 2**64 silently (array ops do not warn on overflow)
    words[: n_full * _BLOCK_WORDS].reshape(n_full, _BLOCK_WORDS).sum(axis=1, out=sums[:n_full])
    sums[n_full] = words[n_full * _BLOCK_WORDS:].sum(dtype="<u8")
    tail = int.from_bytes(mv[n_words * 8:], "little")     # the last < 8 bytes, zero-padded
    sums[n_full] = (int(sums[n_full]) + tail) & _MASK64
    weights = _WEIGHTS[: n_full + 1] if n_full < len(_WEIGHTS) else \
        np.arange(1, n_full + 2, dtype="<u8")
    return int(sums.sum(dtype="<u8")), int(np.dot(sums, weights))


def header(key: str, payload: Buffer) -> bytes:
    s1, s2 = checksum(payload)
    return _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, key_hash(key),
                        memoryview(payload).nbytes, s1, s2)


def encode(key: str, payload: Buffer) -> bytes:
    """The blob to store: header and payload joined (one copy of the payload)."""
    return b"".join((header(key, payload), payload))


def parse_header(key: str, head: Buffer) -> tuple[int, int, int]:
    """(payload length, s1, s2) of a header that belongs to `key`; raises CorruptEntry."""
    if len(head) < HEADER_SIZE:
        raise CorruptEntry(f"short header ({len(head)} bytes)")
    magic, version, size, khash, length, s1, s2 = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise CorruptEntry("bad magic")
    if version != VERSION or size != HEADER_SIZE:
        raise CorruptEntry(f"format version {version}, expected {VERSION}", delete=False)
    if khash != key_hash(key):
        raise CorruptEntry("entry belongs to another key")
    return length, s1, s2


def verify(payload: Buffer, s1: int, s2: int) -> None:
    if checksum(payload) != (s1, s2):
        raise CorruptEntry("checksum mismatch")


def decode(key: str, blob: Buffer) -> memoryview:
    """The payload of `blob` as a view (no copy), after checking it; raises CorruptEntry."""
    mv = memoryview(blob).cast("B")
    length, s1, s2 = parse_header(key, mv[:HEADER_SIZE])
    if len(mv) != HEADER_SIZE + length:
        raise CorruptEntry(f"{len(mv) - HEADER_SIZE} payload bytes, header says {length}")
    payload = mv[HEADER_SIZE:]
    verify(payload, s1, s2)
    return payload
