"""EncoderPool: N vision-encoder processes, each with its own embedding cache. Every media
item goes to the worker the consistent-hash ring picks for its cache key, so a repeated
item lands where its embeddings are cached (N caches hold N times the distinct media one
would), and a worker joining or leaving moves only about 1/N of the keys.

Each worker loads the checkpoint, keeps only the vision tower (its family's adapter builds
it) and serves requests on its own pipe: (keys, patches) in, (embeddings, hit flags,
ran_forward) out. With a shared-memory spec each worker's cache sits in front of the
machine's shared segment (embed_store.py), so a key one worker encoded is a hit on all.
Tensors cross the pipes as numpy arrays (plain pickled bytes): no file descriptors are
passed around.
A call to one worker holds that worker's lock; calls to different workers run at once.

A worker that dies (killed, out of memory, a crash in native code) is restarted under its
lock by the call that finds it dead, which then retries once on the fresh process (whose
cache is empty); a second death in the same call fails that call only. Either way the pool
is whole again for the next call.
"""
from __future__ import annotations

import multiprocessing as mp
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import numpy as np
import torch

from .hash_ring import ConsistentHashRing

READY_TIMEOUT_S = 300.0


@dataclass
class WorkerReply:
    embeds: list[torch.Tensor]
    hit: list[bool]             # per item: served from a cache
    forwarded: bool

    @property
    def hits(self) -> int:
        return sum(self.hit)

    @property
    def misses(self) -> int:
        return len(self.hit) - self.hits


def _serve(model: str, dtype: str, cache_bytes: int, threads: int, shm, conn) -> None:
    """The worker process: load the tower, then answer until told to stop (None)."""
    torch.set_num_threads(threads)
    from ..models import registry
    from .adapter import adapter_for
    from .embed_store import close_cache, make_embed_cache, tower_fingerprint
    try:
        loaded = registry.load(model, progress=False)
        adapter = adapter_for(loaded.config)
        if adapter is None:
            raise ValueError(f"{model} has no vision tower")
        tower = adapter.build_tower(loaded.weights, getattr(torch, dtype))
        del loaded      # the language model's weights: not this process's business
        fingerprint = tower_fingerprint(tower, dtype)
        cache = make_embed_cache(cache_bytes, shm, fingerprint)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails to start
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    try:
        conn.send(("ready", fingerprint))
        while (msg := conn.recv()) is not None:
            keys, items = msg
            try:
                conn.send(("ok", _encode(tower, adapter, cache, keys, items)))
            except Exception as e:  # noqa: BLE001 - this call fails, the worker lives on
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:            # also when the parent died (EOFError): detach the shared segment
        close_cache(cache)


def _encode(tower, adapter, cache, keys, items):
    out = [cache.get(k) for k in keys]
    hit = [e is not None for e in out]
    todo: dict[str, tuple[np.ndarray, tuple]] = {}
    for k, e, item in zip(keys, out, items):
        if e is None:
            todo.setdefault(k, item)
    if todo:
        px = torch.cat([torch.from_numpy(p) for p, _ in todo.values()])
        grids = torch.tensor([g for _, g in todo.values()])
        with torch.inference_mode():
            embeds = tower(px, grids)
        sizes = [adapter.tokens_per_item(g) for g in grids.tolist()]
        made = dict(zip(todo, torch.split(embeds, sizes)))
        for k, e in made.items():
            cache.put(k, e.clone())
        out = [e if e is not None else made[k] for k, e in zip(keys, out)]
    arrays = [e.float().numpy() if e.dtype == torch.bfloat16 else e.numpy() for e in out]
    return (arrays, hit, bool(todo))


class WorkerDied(RuntimeError):
    """An encoder worker process died during a call (and was restarted)."""


class EncoderPool:
    def __init__(self, model: str, workers: int, dtype: torch.dtype, cache_bytes: int,
                 threads_per_worker: int = 1, shm=None):
        """`shm`: an embed_store.ShmSpec, the machine's shared cache behind each worker's."""
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._ctx = mp.get_context("spawn")     # fork after torch started threads can deadlock
        self._args = (model, str(dtype).removeprefix("torch."), cache_bytes, threads_per_worker,
                      shm)
        self.fingerprint = ""      # the tower's (embed_store.tower_fingerprint), from a worker
        self.dtype = dtype
        self.names = [f"encoder-{i}" for i in range(workers)]
        self.ring = ConsistentHashRing(self.names)
        self.restarts = 0
        self._conns: dict[str, Connection] = {}
        self._procs: dict[str, BaseProcess] = {}
        self._locks = {w: threading.Lock() for w in self.names}
        for w in self.names:
            self._spawn(w)
        for w in self.names:
            try:
                self._await_ready(w)
            except RuntimeError:
                self.close()
                raise

    def _spawn(self, w: str) -> None:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_serve, args=(*self._args, child), name=f"mimo-{w}",
                              daemon=True)
        p.start()
        child.close()
        self._conns[w], self._procs[w] = parent, p

    def _await_ready(self, w: str) -> None:
        if not self._conns[w].poll(READY_TIMEOUT_S):
            raise RuntimeError(f"{w} did not start in {READY_TIMEOUT_S:.0f} s")
        kind, detail = self._conns[w].recv()
        if kind != "ready":
            raise RuntimeError(f"{w} failed to start: {detail}")
        self.fingerprint = detail

    def _restart(self, w: str) -> None:
        """Replace a dead worker (the caller holds its lock)."""
        old, conn = self._procs[w], self._conns[w]
        old.join(timeout=5)
        if old.is_alive():
            old.kill()
            old.join(timeout=5)
        conn.close()
        self.restarts += 1
        self._spawn(w)
        self._await_ready(w)

    def route(self, key: str) -> str:
        return self.ring.route(key)

    def encode(self, worker: str, keys: list[str], items: list[tuple[torch.Tensor, tuple]]
               ) -> WorkerReply:
        """Blocking: one worker's items (its cache first, one forward for the misses)."""
        payload = (keys, [(p.cpu().numpy(), tuple(g)) for p, g in items])
        with self._locks[worker]:
            for attempt in (1, 2):
                conn = self._conns[worker]
                try:
                    conn.send(payload)
                    kind, result = conn.recv()
                    break
                except (EOFError, OSError):     # the process is gone: its pipe broke
                    code = self._procs[worker].exitcode
                    self._restart(worker)
                    if attempt == 2:
                        raise WorkerDied(f"{worker} died twice on this request (exit code "
                                         f"{code}); it was restarted") from None
        if kind != "ok":
            raise RuntimeError(f"{worker}: {result}")
        arrays, hit, forwarded = result
        return WorkerReply([torch.from_numpy(a).to(self.dtype) for a in arrays], hit, forwarded)

    def close(self) -> None:
        for conn in self._conns.values():
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for p in self._procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for conn in self._conns.values():
            conn.close()
        self._procs.clear()
