"""Helpers for the pipeline tests: run a test coroutine on a fresh loop and check that it
leaves no task behind; measure concurrency inside a stage."""
from __future__ import annotations

import asyncio
import functools


def async_test(timeout: float = 5.0):
    """Run an `async def test_...` with asyncio.run. After the body, every task it (or the
    pipelines it used) started must be finished: a leak fails the test."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            async def main():
                try:
                    await asyncio.wait_for(fn(*args, **kwargs), timeout)
                finally:
                    await asyncio.sleep(0)   # let done-callbacks run
                    left = asyncio.all_tasks() - {asyncio.current_task()}
                    # Reap leftovers (also after a failure) so none logs "exception never
                    # retrieved" from the garbage collector later.
                    for t in left:
                        t.cancel()
                    await asyncio.gather(*left, return_exceptions=True)
                assert not left, f"tasks leaked: {left}"
            asyncio.run(main())
        return wrapper
    return deco


class Gauge:
    """Counts how many callers are inside a `with gauge:` block now, and the most ever."""

    def __init__(self):
        self.now = 0
        self.max = 0

    def __enter__(self):
        self.now += 1
        self.max = max(self.max, self.now)
        return self

    def __exit__(self, *exc):
        self.now -= 1


async def settle(n: int = 5) -> None:
    """Yield to the loop a few times so ready tasks reach their next await."""
    for _ in range(n):
        await asyncio.sleep(0)
