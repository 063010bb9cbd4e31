"""SharedEmbedCache: one embedding cache in shared memory for every encoder process on a
machine that opens the same name.

Files (in /dev/shm): `NAME.seg` (the segment, mmapped), `NAME.lock` (flock: held briefly
for attach, detach and every index read or write) and `NAME.users` (every live user holds a
shared flock on it for its lifetime; the kernel drops it when the process dies, even by
SIGKILL). Attaching under the lock, a process that can take `NAME.users` exclusively is
alone: the segment is fresh or left by dead users, and it is (re)initialized, so a crash
leaks nothing past the next start. Detaching, the last user unlinks all three files.

Segment: a header, an index of fixed slots, then a data ring. A put takes the next slot
(slots are reused in order) and the next bytes of the ring (wrapping at its end); slots
whose bytes it overwrites are evicted first, so eviction is FIFO. A slot is committed last
(its `commit` field), after its bytes and a CRC32 over key, shape, dtype and bytes: an
entry a dying writer left half-written is uncommitted, and one whose bytes do not match
its CRC is dropped on read. Either way it is a miss, never wrong embeddings.

Keys are 128-bit blake2b digests of the caller's key (media hash, processor settings,
cache salt) joined with the encoder's fingerprint, so models never share entries.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import os
import re
import struct
import zlib

import numpy as np
import torch

from .embed_cache import CacheStats

log = logging.getLogger("mimo.multimodal")

MAGIC = b"MIMOSHM1"
HEADER = struct.Struct("<8sIIQQQQQQQ")   # magic, version, slots, data bytes, cursor, seq,
HEADER_BYTES = 4096                       # hits, misses, puts, evictions
VERSION = 1
SLOT = np.dtype([("k0", "<u8"), ("k1", "<u8"), ("commit", "<u8"), ("off", "<u8"),
                 ("nbytes", "<u8"), ("shape", "<u8", (4,)), ("ndim", "<u4"),
                 ("dtype", "<u4"), ("crc", "<u4"), ("pad", "<u4")])
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SLOT_BYTES_TARGET = 32 * 1024            # one slot per this many bytes of segment
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def _align(n: int) -> int:
    return (n + 4095) // 4096 * 4096


def layout(capacity_bytes: int) -> tuple[int, int]:
    """(slots, data bytes) of a segment of about `capacity_bytes`."""
    slots = max(64, min(1 << 16, capacity_bytes // SLOT_BYTES_TARGET))
    data = capacity_bytes - HEADER_BYTES - _align(slots * SLOT.itemsize)
    if data < 4096:
        raise ValueError(f"shared embedding cache of {capacity_bytes} bytes is too small")
    return slots, data


def _lock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX)


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


class SharedEmbedCache:
    """Tensors by key in a shared segment; `get`/`put` like EmbedCache (thread-safe: each
    call holds the file lock; flock is per open file, so threads of one process serialize
    through a process-local lock too)."""

    def __init__(self, name: str, capacity_bytes: int, fingerprint: str,
                 directory: str = "/dev/shm"):
        if not _NAME.match(name):
            raise ValueError(f"shared cache name must be 1-100 of [A-Za-z0-9_.-], not {name!r}")
        import threading
        self.name, self.fingerprint = name, fingerprint
        self.paths = {s: os.path.join(directory, f"{name}.{s}") for s in ("seg", "lock", "users")}
        self.stats = CacheStats()
        self.reclaimed = False          # this attach found a segment whose users were all dead
        self._tlock = threading.Lock()
        self._closed = False
        self._lfd = self._open_lock()
        try:
            self._attach(capacity_bytes)
        finally:
            _unlock(self._lfd)

    # ---- attach / detach ----------------------------------------------------------------
    def _open_lock(self) -> int:
        """The lock file, locked; retried when a last user unlinked it meanwhile."""
        while True:
            fd = os.open(self.paths["lock"], os.O_RDWR | os.O_CREAT, 0o600)
            _lock(fd)
            try:
                if os.stat(self.paths["lock"]).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def _attach(self, capacity_bytes: int) -> None:
        self._ufd = os.open(self.paths["users"], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._ufd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        sfd = os.open(self.paths["seg"], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = os.fstat(sfd).st_size
            if alone:
                self.reclaimed = size > 0
                if self.reclaimed:
                    log.warning("shared embedding cache %s: reclaiming a segment whose users "
                                "all exited without detaching", self.name)
                slots, data = layout(capacity_bytes)
                size = HEADER_BYTES + _align(slots * SLOT.itemsize) + data
                os.ftruncate(sfd, 0)               # zero pages: every slot uncommitted
                os.ftruncate(sfd, size)
                self._mm = mmap.mmap(sfd, size)
                self._mm[:HEADER.size] = HEADER.pack(MAGIC, VERSION, slots, data, 0, 0, 0, 0,
                                                     0, 0)
            else:
                self._mm = mmap.mmap(sfd, size)
                magic, version, slots, data, *_ = HEADER.unpack_from(self._mm)
                if magic != MAGIC or version != VERSION:
                    raise RuntimeError(f"{self.paths['seg']} is not a mimo embedding cache "
                                       f"(version {VERSION})")
        finally:
            os.close(sfd)
        fcntl.flock(self._ufd, fcntl.LOCK_SH)      # under the lock: nobody attaches meanwhile
        self.slots, self.data_bytes = slots, data
        self.capacity_bytes = size
        self._index = np.ndarray((slots,), SLOT, buffer=self._mm, offset=HEADER_BYTES)
        self._data0 = HEADER_BYTES + _align(slots * SLOT.itemsize)

    def close(self) -> None:
        """Detach; the last user removes the segment and its files (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._tlock:
            _lock(self._lfd)
            try:
                del self._index
                self._mm.close()
                try:
                    fcntl.flock(self._ufd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    last = True
                except BlockingIOError:
                    last = False
                if last:
                    for p in self.paths.values():
                        try:
                            os.unlink(p)
                        except FileNotFoundError:
                            pass
                os.close(self._ufd)
            finally:
                os.close(self._lfd)        # releases the lock

    def __enter__(self) -> SharedEmbedCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- entries ------------------------------------------------------------------------
    def _digest(self, key: str) -> tuple[int, int]:
        d = hashlib.blake2b(f"{self.fingerprint}|{key}".encode(), digest_size=16).digest()
        return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")

    def _header(self) -> list:
        return list(HEADER.unpack_from(self._mm))

    def _count(self, field: int, n: int = 1) -> None:
        h = self._header()
        h[field] += n
        self._mm[:HEADER.size] = HEADER.pack(*h)

    def _find(self, k0: int, k1: int) -> int | None:
        ix = self._index
        hit = np.flatnonzero((ix["k0"] == k0) & (ix["k1"] == k1) & (ix["commit"] != 0))
        return int(hit[0]) if hit.size else None

    @staticmethod
    def _crc(k0: int, k1: int, shape: tuple, dtype: int, data) -> int:
        meta = struct.pack("<QQI4Q", k0, k1, dtype, *shape, *[0] * (4 - len(shape)))
        return zlib.crc32(data, zlib.crc32(meta))

    def __contains__(self, key: str) -> bool:
        with self._tlock:
            _lock(self._lfd)
            try:
                return self._find(*self._digest(key)) is not None
            finally:
                _unlock(self._lfd)

    def get(self, key: str) -> torch.Tensor | None:
        k0, k1 = self._digest(key)
        with self._tlock:
            _lock(self._lfd)
            try:
                i = self._find(k0, k1)
                if i is not None:
                    s = self._index[i].copy()
                    start = self._data0 + int(s["off"])
                    raw = bytearray(self._mm[start:start + int(s["nbytes"])])
                    shape = tuple(int(x) for x in s["shape"][:int(s["ndim"])])
                    if self._crc(k0, k1, shape, int(s["dtype"]), raw) != int(s["crc"]) or \
                            int(s["dtype"]) >= len(DTYPES):
                        self._index[i]["commit"] = 0        # torn or corrupt: drop it
                        log.warning("shared embedding cache %s: dropped a corrupt entry",
                                    self.name)
                        i = None
                self._count(6 if i is not None else 7)
            finally:
                _unlock(self._lfd)
        if i is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return t.view(DTYPES[int(s["dtype"])]).reshape(shape)

    def put(self, key: str, value: torch.Tensor) -> bool:
        """Store `value` (evicting the oldest entries its bytes or slot overwrite). False
        when it is larger than the data ring or of a dtype the segment does not hold."""
        if value.dtype not in DTYPES or value.dim() > 4:
            return False
        raw = value.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy()
        n = raw.nbytes
        if n > self.data_bytes:
            self.stats.rejected += 1
            return False
        k0, k1 = self._digest(key)
        shape, code = tuple(value.shape), DTYPES.index(value.dtype)
        crc = self._crc(k0, k1, shape, code, raw)
        with self._tlock:
            _lock(self._lfd)
            try:
                if self._find(k0, k1) is not None:
                    return True
                self._write(k0, k1, shape, code, crc, raw)
            finally:
                _unlock(self._lfd)
        return True

    def _write(self, k0: int, k1: int, shape: tuple, code: int, crc: int, raw) -> None:
        """Under the lock. Order matters for a writer killed halfway: evict, then bytes,
        then the slot's fields, its commit last."""
        h = self._header()
        cursor, seq, n = h[4], h[5] + 1, raw.nbytes
        if cursor + n > self.data_bytes:
            cursor = 0
        ix = self._index
        slot = seq % self.slots
        live = ix["commit"] != 0
        overlap = live & (ix["off"] < cursor + n) & (ix["off"] + ix["nbytes"] > cursor)
        overlap[slot] = live[slot]
        evicted = int(overlap.sum())
        ix["commit"][overlap] = 0
        h[4], h[5], h[9] = cursor + n, seq, h[9] + evicted
        h[8] += 1
        self._mm[:HEADER.size] = HEADER.pack(*h)
        self.stats.evictions += evicted
        start = self._data0 + cursor
        self._mm[start:start + n] = memoryview(raw)
        rec = np.zeros((), SLOT)
        rec["k0"], rec["k1"], rec["off"], rec["nbytes"] = k0, k1, cursor, n
        rec["shape"][:len(shape)] = shape
        rec["ndim"], rec["dtype"], rec["crc"] = len(shape), code, crc
        ix[slot] = rec                                   # commit still 0
        ix["commit"][slot] = seq

    def shared_stats(self) -> dict:
        """Counters of every user of the segment since it was (re)initialized."""
        with self._tlock:
            _lock(self._lfd)
            try:
                h = self._header()
                live = int((self._index["commit"] != 0).sum())
            finally:
                _unlock(self._lfd)
        return {"entries": live, "slots": self.slots, "data_bytes": self.data_bytes,
                "hits": h[6], "misses": h[7], "puts": h[8], "evictions": h[9]}
