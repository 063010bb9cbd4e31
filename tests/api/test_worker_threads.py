"""The server's pool for blocking work starts every thread up front, so the process's thread
count does not move with how requests overlap."""
import asyncio
import threading
import time

import pytest

from mimo.api import worker_threads


def _new_pool_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    # Threads left by earlier tests may end at any moment, so the pool's own are told apart
    # by identity and name rather than by the process's thread count.
    return {t for t in threading.enumerate()
            if t not in before and t.name.startswith("mimo-io")}


def test_every_thread_started_and_none_added_under_load():
    before = set(threading.enumerate())
    pool = worker_threads.started_pool(4)
    try:
        started = _new_pool_threads(before)
        assert len(started) == 4 and all(t.is_alive() for t in started)
        # 12 overlapping tasks: a lazily grown pool would be at its bound only by chance
        futs = [pool.submit(time.sleep, 0.02) for _ in range(12)]
        for f in futs:
            f.result()
        assert _new_pool_threads(before) == started
    finally:
        pool.shutdown(wait=True)
    assert not any(t.is_alive() for t in started)


def test_install_serves_to_thread():
    async def go():
        loop = asyncio.get_running_loop()
        pool = worker_threads.install(loop, 3)
        names = await asyncio.gather(*(asyncio.to_thread(lambda: threading.current_thread().name)
                                       for _ in range(6)))
        pool.shutdown(wait=True)
        return names
    names = asyncio.run(go())
    assert all(n.startswith("mimo-io") for n in names)


def test_bad_size_refused():
    with pytest.raises(ValueError, match="at least one thread"):
        worker_threads.started_pool(0)
