"""Helpers for the pipeline tests: a typed request, run a test coroutine on a fresh loop
and check that it leaves no task behind; measure concurrency inside a stage."""
from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any

from mimo.pipeline import Request


@dataclass(eq=False, kw_only=True)
class Job(Request):
    """The tests' request: the inputs their stages read and the fields they write."""
    x: Any = None
    i: int = 0
    n: int = 0
    cost: float = 1.0
    echo: int = 0
    stop: str | None = None
    fail_at: int | None = None
    trace: list[str] = field(default_factory=list)
    out: dict[str, Any] = field(default_factory=dict)   # a stage's name -> what it wrote


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
