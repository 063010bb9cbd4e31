"""Stage: one async step of a pipeline, run per request under a concurrency limit."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from .errors import PipelineError, StageError
from .request import Request, StageTiming


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def tag(err: PipelineError, stage: str) -> PipelineError:
    """Name the stage a PipelineError came from, unless an inner stage already did."""
    if err.stage is None:
        err.stage = stage
    return err


@contextlib.contextmanager
def stage_errors(stage: str) -> Iterator[None]:
    """The one rule for what escapes a stage: PipelineErrors keep their type (tagged with
    the stage), any other Exception becomes StageError. Cancellation (a BaseException)
    passes through untouched."""
    try:
        yield
    except PipelineError as e:
        tag(e, stage)
        raise
    except Exception as e:
        raise StageError(stage, e) from e


class Stage:
    """Subclass and define `async def process(self, req)`:

      * fill the request's typed fields (see Request) and return None, or return a value:
        the last stage's value is what `Pipeline.run` returns (others' are dropped).
      * or make it an async generator (`yield` inside): a *streaming* stage, whose items
        `Pipeline.stream` yields. A streaming stage placed after another streaming stage
        receives that stage's items: `async def process(self, req, upstream)` and
        `async for item in upstream: yield ...` (e.g. decode -> detokenize).

    Raise `InvalidRequest` for bad client input; any other exception becomes a `StageError`
    for this request only. Cancellation arrives as `asyncio.CancelledError` at an `await`;
    release what you hold in `finally` (e.g. abort the engine's sequence) and let it
    propagate. Blocking work (model forwards, decoding) belongs in a thread
    (`await asyncio.to_thread(...)`) so the event loop keeps serving.

    `max_concurrency` bounds how many requests are inside `process` at once (None: no
    bound; for a streaming stage a slot is held until its stream ends). Requests over the
    bound wait, in arrival order. `name` defaults to the class name in snake_case.
    """
    name: str = "stage"
    max_concurrency: int | None = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "name" not in cls.__dict__:
            cls.name = _snake(cls.__name__)

    def __init__(self, name: str | None = None, *, max_concurrency: int | None = None):
        if name is not None:
            self.name = name
        if max_concurrency is not None:
            self.max_concurrency = max_concurrency

    # ---- the contract -----------------------------------------------------------------
    if TYPE_CHECKING:
        # Each stage narrows the request to its pipeline's Request subclass, and may take
        # `upstream` and be an async generator (see above); Pipeline checks the shape when
        # it is built. To the type checker it is any callable.
        process: Callable[..., Any]
    else:
        async def process(self, req: Request) -> Any:
            raise NotImplementedError(f"{type(self).__name__} must define process()")

    async def close(self) -> None:
        """Release what the stage owns (background tasks, pools). Pipeline.close calls it."""

    @property
    def streams(self) -> bool:
        """True when `process` is an async generator (computed once: inspect is slow)."""
        d = self.__dict__
        if "_streams" not in d:
            d["_streams"] = inspect.isasyncgenfunction(self.process)
        streams: bool = d["_streams"]
        return streams

    def accepts_upstream(self) -> bool:
        """True when `process` can be called as process(req, upstream)."""
        try:
            inspect.signature(self.process).bind(None, None)
            return True
        except TypeError:
            return False

    # ---- what the pipeline calls (also usable on its own) -------------------------------
    def _slots(self) -> asyncio.Semaphore | None:
        # Lazily made, so subclasses need not call __init__ and no loop is bound early.
        sem = self.__dict__.get("_sem")
        if sem is None and self.max_concurrency is not None:
            if self.max_concurrency < 1:
                raise ValueError(f"stage {self.name!r}: max_concurrency must be >= 1")
            sem = self.__dict__["_sem"] = asyncio.Semaphore(self.max_concurrency)
        return sem

    async def run(self, req: Request) -> Any:
        """Run `process` for one request under the concurrency limit; record its timing;
        turn a foreign exception into StageError. Not for streaming stages (see stream)."""
        if self.streams:
            raise TypeError(f"stage {self.name!r} streams; iterate stage.stream(req)")
        t0 = time.monotonic()
        sem = self._slots()
        if sem is not None:
            await sem.acquire()     # cancellation while waiting takes no slot
        t1 = time.monotonic()
        req.stage = self.name
        try:
            with stage_errors(self.name):
                result = await self.process(req)
        finally:
            req.stage = None
            if sem is not None:
                sem.release()
            req.timings[self.name] = StageTiming(t1 - t0, time.monotonic() - t1)
        return result

    async def stream(self, req: Request, upstream: AsyncIterator[Any] | None = None
                     ) -> AsyncIterator[Any]:
        """Iterate a streaming stage's items for one request. The concurrency slot is held
        until the stream ends, fails or is closed; close it (`aclose`) when stopping early
        so the stage's own cleanup runs now rather than at garbage collection."""
        t0 = time.monotonic()
        sem = self._slots()
        if sem is not None:
            await sem.acquire()
        t1 = time.monotonic()
        try:
            with stage_errors(self.name):
                req.stage = self.name
                process: Callable[..., Any] = self.process   # an async generator function
                gen: AsyncGenerator[Any, None] = (process(req) if upstream is None
                                                  else process(req, upstream))
                try:
                    async for item in gen:
                        yield item
                        req.stage = self.name   # a downstream stage ran while we were suspended
                finally:
                    await gen.aclose()
        finally:
            req.stage = None
            if sem is not None:
                sem.release()
            req.timings[self.name] = StageTiming(t1 - t0, time.monotonic() - t1)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} max_concurrency={self.max_concurrency}>"


class FunctionStage(Stage):
    """A stage from a plain `async def fn(req)` (or an async generator function). Pipeline
    wraps bare functions in one, named after the function."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None, *,
                 max_concurrency: int | None = None):
        if not (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)):
            raise TypeError(f"{fn!r} is not an async function; stages never block the event "
                            "loop (wrap blocking work in asyncio.to_thread)")
        super().__init__(name or getattr(fn, "__name__", "function"),
                         max_concurrency=max_concurrency)
        self.process = fn
