"""The server's pool for blocking work (`asyncio.to_thread`: tokenizing, reading files), with
every thread started up front.

asyncio's own default executor starts a thread only when a task finds none idle, so how many
it holds depends on how requests happened to overlap: a leak check that counts threads after
a warm-up could see one more appear later without anything leaking. A pool started whole
has one thread count for the server's life."""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor


def pool_size() -> int:
    """asyncio's default bound: min(32, CPUs + 4)."""
    return min(32, (os.cpu_count() or 1) + 4)


def started_pool(size: int | None = None, timeout: float = 30.0) -> ThreadPoolExecutor:
    """A thread pool with all `size` threads running: `size` tasks that each wait for the
    others, so every submit finds no idle thread and starts one."""
    size = pool_size() if size is None else size
    if size < 1:
        raise ValueError(f"a worker pool needs at least one thread, got {size}")
    pool = ThreadPoolExecutor(size, thread_name_prefix="mimo-io")
    barrier = threading.Barrier(size, timeout=timeout)
    for f in [pool.submit(barrier.wait) for _ in range(size)]:
        f.result(timeout=timeout)
    return pool


def install(loop: asyncio.AbstractEventLoop, size: int | None = None) -> ThreadPoolExecutor:
    """Make a started pool the loop's default executor (what `asyncio.to_thread` uses)."""
    pool = started_pool(size)
    loop.set_default_executor(pool)
    return pool
