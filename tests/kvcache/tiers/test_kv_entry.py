"""The L3 entry format: every payload round-trips, every corruption is caught."""
from __future__ import annotations

import os
import random
import struct

import pytest

from mimo.kvcache.tiers import entry

SIZES = [0, 1, 7, 8, 9, 4095, 4096, 4097, 8 * 4096 + 5, 1 << 20]


@pytest.mark.parametrize("size", SIZES)
def test_round_trip(size):
    payload = os.urandom(size)
    blob = entry.encode("key/1", payload)
    assert len(blob) == entry.HEADER_SIZE + size
    assert bytes(entry.decode("key/1", blob)) == payload
    # the header and the payload sent separately (the file store) make the same bytes
    assert entry.header("key/1", payload) + payload == blob


def test_decode_returns_a_view_not_a_copy():
    blob = entry.encode("k", os.urandom(1 << 16))
    view = entry.decode("k", blob)
    assert isinstance(view, memoryview) and view.obj is blob


def test_header_fields():
    payload = os.urandom(1000)
    blob = entry.encode("k", payload)
    magic, version, size, _khash, length, s1, s2 = struct.unpack_from("<4sHH16sQQQ", blob)
    assert (magic, version, size, length) == (b"MIKV", entry.VERSION, 48, 1000)
    # s1 is the plain sum of the little-endian words (zero-padded tail), mod 2**64
    padded = payload + bytes(-len(payload) % 8)
    words = struct.unpack(f"<{len(padded) // 8}Q", padded)
    assert s1 == sum(words) % (1 << 64)
    assert (s1, s2) == entry.checksum(payload)


def _corruptions(blob: bytes, rng: random.Random):
    n = len(blob)
    flip = bytearray(blob)
    pos = rng.randrange(entry.HEADER_SIZE, n)
    flip[pos] ^= 1 << rng.randrange(8)
    yield "bit flip in payload", bytes(flip)
    yield "truncated", blob[: n // 2]
    yield "one byte short", blob[:-1]
    yield "short header", blob[:20]
    yield "empty", b""
    yield "trailing byte", blob + b"\0"
    magic = bytearray(blob)
    magic[0] ^= 0xFF
    yield "bad magic", bytes(magic)
    length = bytearray(blob)
    struct.pack_into("<Q", length, 24, n - entry.HEADER_SIZE - 8)
    yield "length field", bytes(length)
    zeroed = bytearray(blob)
    zeroed[entry.HEADER_SIZE + 4096: entry.HEADER_SIZE + 8192] = bytes(4096)
    yield "zeroed block", bytes(zeroed)
    p = blob[entry.HEADER_SIZE:]
    swapped = p[4096:8192] + p[:4096] + p[8192:]
    yield "blocks swapped", blob[: entry.HEADER_SIZE] + swapped
    yield "another key's entry", entry.encode("other", p)


@pytest.mark.parametrize("seed", range(5))
def test_every_corruption_is_caught(seed):
    rng = random.Random(seed)
    payload = rng.randbytes(3 * 4096 + rng.randrange(4096))
    blob = entry.encode("the-key", payload)
    for what, bad in _corruptions(blob, rng):
        with pytest.raises(entry.CorruptEntry) as e:
            entry.decode("the-key", bad)
        assert e.value.delete, what


def test_any_single_bit_flip_is_caught():
    payload = random.Random(1).randbytes(5000)
    blob = entry.encode("k", payload)
    for pos in range(len(blob)):
        for bit in (0, 7):
            bad = bytearray(blob)
            bad[pos] ^= 1 << bit
            with pytest.raises(entry.CorruptEntry):
                entry.decode("k", bytes(bad))


def test_other_version_is_a_miss_but_not_garbage():
    blob = bytearray(entry.encode("k", b"payload"))
    struct.pack_into("<H", blob, 4, entry.VERSION + 1)
    with pytest.raises(entry.CorruptEntry) as e:
        entry.decode("k", bytes(blob))
    assert not e.value.delete

