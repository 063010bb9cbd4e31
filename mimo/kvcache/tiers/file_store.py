"""FileStore: L3 entries as files in a local directory, with a byte cap and LRU eviction.

Layout: ROOT/ab/abcdef... one file per key, named by the hex of a blake2b of the key (sharded
by its first two hex digits). A write goes to a temporary file in the same folder and is
renamed over the name (os.replace), so a reader sees the old entry or the new one, never half
of one. There is no fsync: after a power cut a file may come back short or zeroed, and the
header check (entry.py) turns it into a miss that deletes it.

The in-memory index (name -> size, last use), in LRU order, is rebuilt from the directory on
first use (file mtimes are the ages), so the cache survives restarts; hits and touches set
the mtime. Invariant, under `_lock`: `_total` is the sum of the index sizes, and with this
process the only writer the index is exactly the entry files on disk (check_integrity). Other
processes may read and write the same directory (their entries are found on disk and adopted
into the index), but then the cap is only kept per process.

All file I/O runs on a small thread pool: a batch is one task that handles its keys in order
and stops at the deadline, so the keys done by then keep their answers.
"""
from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import TypeVar

from . import entry
from .storage import KVStorage, Payload, StorageIntegrityError, StorageStats

T = TypeVar("T")
_HEX = frozenset("0123456789abcdef")
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_STALE_TEMP_S = 600.0      # a temporary file this old was left by a writer that died


def _is_entry_name(name: str) -> bool:
    return len(name) == 32 and set(name) <= _HEX


class FileStore(KVStorage):
    scheme = "file"

    def __init__(self, root: str, *, disk_cap: int | None = None, min_age: float = 1.0,
                 workers: int = 4):
        if disk_cap is not None and disk_cap < 0:
            raise ValueError(f"disk_cap must be >= 0 or None, got {disk_cap}")
        if min_age < 0:
            raise ValueError(f"min_age must be >= 0, got {min_age}")
        self.root = os.path.abspath(os.path.expanduser(root))
        self.disk_cap, self.min_age, self.workers = disk_cap, min_age, workers
        self.stats = StorageStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[str, tuple[int, float]] = OrderedDict()   # LRU first
        self._total = 0        # bytes of the indexed files
        self._reserved = 0     # bytes of writes in flight, already made room for
        self._loaded = False
        self._pool: ThreadPoolExecutor | None = None

    def describe(self) -> str:
        cap = "" if self.disk_cap is None else f" (cap {self.disk_cap} bytes)"
        return f"file:{self.root}{cap}"

    @staticmethod
    def file_name(key: str) -> str:
        return hashlib.blake2b(key.encode(), digest_size=16, person=b"mimo-kv-file").hexdigest()

    def path_of(self, key: str) -> str:
        name = self.file_name(key)
        return os.path.join(self.root, name[:2], name)

    # ---- the KVStorage methods (I/O loop) -----------------------------------------------
    async def get(self, keys: Sequence[str], timeout: float) -> list[Payload | None]:
        done = await self._batch(lambda i: self._get_one(keys[i]), len(keys), timeout)
        values: list[Payload | None] = [d[0] if d else None for d in done]
        self._count_get(values, [d[1] if d else "timeout" for d in done])
        self.stats.deleted_corrupt += sum(1 for d in done if d and d[2])
        return values

    async def put(self, items: Sequence[tuple[str, bytes]], timeout: float) -> list[bool]:
        done = await self._batch(lambda i: self._put_one(*items[i]), len(items), timeout)
        ok = [bool(d and d[0]) for d in done]
        self._count_put(items, ok, [d[1] if d else "timeout" for d in done])
        return ok

    async def exists(self, keys: Sequence[str], timeout: float) -> list[bool]:
        done = await self._batch(lambda i: self._exists_one(keys[i]), len(keys), timeout)
        self._count_errors([d[1] if d else "timeout" for d in done])
        return [bool(d and d[0]) for d in done]

    async def touch(self, keys: Sequence[str], timeout: float) -> None:
        done = await self._batch(lambda i: self._touch_one(keys[i]), len(keys), timeout)
        self.stats.touches += len(keys)
        self._count_errors([d[0] if d else "timeout" for d in done])

    async def delete(self, keys: Sequence[str], timeout: float) -> None:
        done = await self._batch(lambda i: self._delete_one(keys[i]), len(keys), timeout)
        self._count_errors([d[0] if d else "timeout" for d in done])

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:     # let writes in flight land, so the index matches the disk
            await asyncio.to_thread(pool.shutdown, True)

    def check_integrity(self) -> None:
        with self._lock:
            self._load()
            on_disk = {name: size for name, size, _ in self._scan()}
            indexed = {name: size for name, (size, _) in self._index.items()}
            if indexed != on_disk:
                extra = len(indexed.keys() - on_disk.keys())
                missing = len(on_disk.keys() - indexed.keys())
                raise StorageIntegrityError(
                    f"{self.root}: index has {extra} entries not on disk, disk {missing} not in "
                    f"the index, sizes differ for "
                    f"{sum(1 for n in indexed.keys() & on_disk.keys() if indexed[n] != on_disk[n])}")
            if self._total != sum(indexed.values()):
                raise StorageIntegrityError(f"{self.root}: total {self._total} != index sum")
            if self.disk_cap is not None and self._total > self.disk_cap:
                raise StorageIntegrityError(
                    f"{self.root}: {self._total} bytes stored over the cap {self.disk_cap}")
            if self._reserved < 0:
                raise StorageIntegrityError(f"{self.root}: negative reservation")

    @property
    def total_bytes(self) -> int:
        return self._total

    # ---- batches ------------------------------------------------------------------------
    async def _batch(self, work: Callable[[int], T], n: int, timeout: float) -> list[T | None]:
        """work(0..n-1) in order on one pool thread until the deadline; None where not done
        (work answers tuples, never None).
        The thread is not interrupted mid-key: a write past the deadline still lands and is
        indexed, it is only reported as not stored."""
        results: list[T | None] = [None] * n
        if n == 0:
            return results
        stop = threading.Event()

        def run() -> None:
            with self._lock:
                self._load()
            for i in range(n):
                if stop.is_set():
                    return
                results[i] = work(i)

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="mimo-kv-file")
        fut = asyncio.get_running_loop().run_in_executor(self._pool, run)
        try:
            await asyncio.wait_for(asyncio.shield(fut), max(timeout, 0.0))
        except asyncio.TimeoutError:
            pass
        finally:
            stop.set()
        return list(results)

    # ---- one key (pool threads) ---------------------------------------------------------
    def _get_one(self, key: str) -> tuple[bytes | None, str | None, bool]:
        """(payload, miss cause, whether a corrupt entry was deleted)."""
        name = self.file_name(key)
        path = os.path.join(self.root, name[:2], name)
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                try:
                    length, s1, s2 = entry.parse_header(key, f.read(entry.HEADER_SIZE))
                    if st.st_size != entry.HEADER_SIZE + length:
                        raise entry.CorruptEntry(f"file of {st.st_size} bytes, header says "
                                                 f"{length} payload bytes")
                    payload = f.read(length)
                    if len(payload) != length:
                        raise entry.CorruptEntry("short read")
                    entry.verify(payload, s1, s2)
                except entry.CorruptEntry as e:
                    return None, "corrupt", e.delete and self._drop_corrupt(name, path, st)
            now = time.time()
            with suppress(OSError):     # gone or replaced since: the payload read is still good
                os.utime(path, (now, now))
            self._used(name, path, now)
            return payload, None, False
        except FileNotFoundError:
            self._forget(name, path)    # never stored, or deleted by another process
            return None, None, False
        except OSError:
            return None, "error", False

    def _put_one(self, key: str, payload: bytes) -> tuple[bool, str | None]:
        name = self.file_name(key)
        shard = os.path.join(self.root, name[:2])
        path = os.path.join(shard, name)
        head = entry.header(key, payload)
        size = len(head) + len(payload)
        if not self._reserve(name, size):
            return False, "full"
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        stored = False
        try:
            try:
                f = open(tmp, "wb")
            except FileNotFoundError:   # a new shard, or the directory was wiped meanwhile
                os.makedirs(shard, exist_ok=True)
                f = open(tmp, "wb")
            with f:
                f.write(head)
                f.write(payload)
            with self._lock:            # the rename and the index change as one step
                os.replace(tmp, path)
                stored = True
                self._reserved -= size
                old = self._index.pop(name, None)
                self._total += size - (old[0] if old else 0)
                self._index[name] = (size, time.time())
        except OSError as e:
            with suppress(OSError):
                os.unlink(tmp)
            return False, "full" if e.errno in _FULL_ERRNOS else "error"
        finally:
            if not stored:
                with self._lock:
                    self._reserved -= size
        return True, None

    def _exists_one(self, key: str) -> tuple[bool, str | None]:
        try:
            os.stat(self.path_of(key))
            return True, None
        except FileNotFoundError:
            return False, None
        except OSError:
            return False, "error"

    def _touch_one(self, key: str) -> tuple[str | None]:
        name = self.file_name(key)
        path = os.path.join(self.root, name[:2], name)
        now = time.time()
        try:
            os.utime(path, (now, now))
            self._used(name, path, now)
        except FileNotFoundError:
            self._forget(name, path)
        except OSError:
            return ("error",)
        return (None,)

    def _delete_one(self, key: str) -> tuple[str | None]:
        name = self.file_name(key)
        with self._lock:
            try:
                os.unlink(os.path.join(self.root, name[:2], name))
            except FileNotFoundError:
                pass
            except OSError:
                return ("error",)
            self._forget_locked(name)
        return (None,)

    def _drop_corrupt(self, name: str, path: str, st: os.stat_result) -> bool:
        """Delete the corrupt file we read, unless a writer has replaced it meanwhile."""
        with self._lock:
            try:
                if os.stat(path).st_ino != st.st_ino:
                    return False
                os.unlink(path)
            except OSError:
                return False
            self._forget_locked(name)
        return True

    # ---- the index (pool threads, under _lock) ------------------------------------------
    # Entry files are renamed into place and unlinked under _lock together with the index
    # change, so check_integrity (which holds it) never sees one without the other.
    def _load(self) -> None:
        """Build the index from the directory once (caller holds _lock)."""
        if self._loaded:
            return
        try:
            os.makedirs(self.root, exist_ok=True)
            found = sorted(self._scan(clean=True), key=lambda e: e[2])
        except OSError:
            return          # retried on the next batch; this one's keys fail on their own
        self._index = OrderedDict((name, (size, mtime)) for name, size, mtime in found)
        self._total = sum(size for _, size, _ in found)
        self._loaded = True

    def _scan(self, clean: bool = False) -> list[tuple[str, int, float]]:
        """(name, size, mtime) of every entry file; with `clean`, delete stale temp files."""
        out: list[tuple[str, int, float]] = []
        now = time.time()
        with os.scandir(self.root) as shards:
            for shard in shards:
                if len(shard.name) != 2 or not shard.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(shard.path) as files:
                    for f in files:
                        try:
                            st = f.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if _is_entry_name(f.name):
                            out.append((f.name, st.st_size, st.st_mtime))
                        elif clean and f.name.endswith(".tmp") \
                                and now - st.st_mtime > _STALE_TEMP_S:
                            with suppress(OSError):
                                os.unlink(f.path)
        return out

    def _used(self, name: str, path: str, now: float) -> None:
        """Refresh an entry's age. One not indexed (another process wrote it) joins the
        index if it is still there: a delete or an eviction may have raced the read."""
        with self._lock:
            old = self._index.pop(name, None)
            if old is None:
                try:
                    old = (os.stat(path).st_size, now)
                except OSError:
                    return
                self._total += old[0]
            self._index[name] = (old[0], now)

    def _forget(self, name: str, path: str) -> None:
        """Drop an entry found missing, unless a write put it back since."""
        with self._lock:
            if name in self._index and not os.path.exists(path):
                self._forget_locked(name)

    def _forget_locked(self, name: str) -> None:
        old = self._index.pop(name, None)
        if old:
            self._total -= old[0]

    def _reserve(self, name: str, size: int) -> bool:
        """Make room for `size` more bytes by evicting LRU entries that are at least min_age
        old; evicts nothing and answers False when that cannot make enough room."""
        with self._lock:
            if self.disk_cap is not None:
                old = self._index.get(name)
                need = self._total + self._reserved + size - (old[0] if old else 0) \
                    - self.disk_cap
                victims: list[str] = []
                if need > 0:
                    limit = time.time() - self.min_age
                    for victim, (vsize, used) in self._index.items():
                        if used > limit:
                            break       # LRU order: every later entry is younger still
                        if victim != name:
                            victims.append(victim)
                            need -= vsize
                            if need <= 0:
                                break
                    if need > 0:
                        return False
                for victim in victims:
                    try:
                        os.unlink(os.path.join(self.root, victim[:2], victim))
                    except FileNotFoundError:
                        pass
                    except OSError:
                        return False    # still on disk, so still indexed; rare (permissions)
                    self._total -= self._index.pop(victim)[0]
            self._reserved += size
            return True
