"""Pipeline: stages composed in order, with backpressure, cancellation and error isolation."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from .admission import Admission
from .errors import PipelineClosed, PipelineError, RequestCancelled
from .request import Request
from .stage import FunctionStage, Stage

log = logging.getLogger("mimo.pipeline")
_END = object()   # stream sentinel: the request's task is done


class Pipeline:
    """Runs each request through `stages` in order.

    `run(req)` returns the last stage's value (for a streaming pipeline: the list of its
    items); `stream(req)` yields the last stage's items as they come (for a non-streaming
    pipeline: its one value). Both raise only `PipelineError`s (see errors.py), except when
    the caller's own task is cancelled, which stays an `asyncio.CancelledError` after the
    request has been cancelled and every stage has unwound.

    Each request runs in its own task, so `req.cancel()` (or a deadline, or `close()`)
    reaches whichever stage it is in, including a BatchStage queue or a stream, and no
    later stage runs for it. A stage's exception fails only that request.

    Backpressure: at most `max_in_flight` requests run at once (None: no bound). Others
    wait in arrival order; at most `max_queued` of them (None: any number, 0: reject at
    once) and each for at most `queue_timeout` seconds; past either: `Overloaded`. A
    stream's items wait in a buffer of `stream_buffer`; a consumer slower than that
    pauses the last stage rather than growing memory.

    Bare `async def` functions (or async generator functions) may be given as stages; they
    are wrapped in a FunctionStage named after the function. Stage names must be unique:
    they key `req.timings`.
    """

    def __init__(self, stages: Iterable[Stage | Callable[..., Any]], *,
                 name: str = "pipeline", max_in_flight: int | None = None,
                 max_queued: int | None = None, queue_timeout: float | None = None,
                 stream_buffer: int = 64):
        self.name = name
        self.stages: tuple[Stage, ...] = tuple(
            s if isinstance(s, Stage) else FunctionStage(s) for s in stages)
        _check_stages(self.stages)
        if stream_buffer < 1:
            raise ValueError("stream_buffer must be >= 1")
        self.stream_buffer = stream_buffer
        self._admission = Admission(max_in_flight, max_queued, queue_timeout)
        self._running: set[Request] = set()    # requests whose task has not finished
        self._closed = False
        self._stages_closed = False

    # ---- introspection (metrics, health) --------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Requests holding a slot (inside the stages)."""
        return self._admission.in_flight

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return self._admission.queued

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def streams(self) -> bool:
        return any(s.streams for s in self.stages)

    def __repr__(self) -> str:
        return (f"<Pipeline {self.name!r} [{' -> '.join(s.name for s in self.stages)}] "
                f"in_flight={self.in_flight} queued={self.queued}>")

    # ---- running requests -----------------------------------------------------------------
    async def run(self, req: Request) -> Any:
        """Run `req` through every stage and return the last stage's value (for a streaming
        pipeline, the list of its items). Its failure raises a PipelineError."""
        task = self._start(req, None)
        await _wait_or_cancel(req, task)
        return _outcome(req, task)

    async def stream(self, req: Request) -> AsyncGenerator[Any, None]:
        """Async generator of the request's items. Stopping early (break, `aclose()`, the
        consumer's task cancelled) cancels the request and closes every stage's stream;
        prefer `contextlib.aclosing(p.stream(req))` so that happens at once, not at garbage
        collection."""
        items: asyncio.Queue[Any] = asyncio.Queue()            # unbounded: _END always fits
        room = asyncio.Semaphore(self.stream_buffer)      # the bound on buffered items

        async def emit(item: Any) -> None:
            await room.acquire()
            items.put_nowait(item)

        task = self._start(req, emit)
        task.add_done_callback(lambda _: items.put_nowait(_END))
        try:
            while (item := await items.get()) is not _END:
                room.release()
                yield item
            _outcome(req, task)     # raises the request's error, if any
        finally:
            if not task.done():     # the consumer stopped early or was cancelled
                req.cancel("stream closed by its consumer")
                await asyncio.wait((task,))

    def _start(self, req: Request, emit: Callable[[Any], Awaitable[None]] | None
               ) -> asyncio.Task[Any]:
        if self._closed:
            raise PipelineClosed(f"pipeline {self.name!r} is closed")
        if req.running:
            raise PipelineError(f"request {req.id} is already running")
        left = req.remaining()
        if left is not None and left <= 0:
            req._expire()
        if req.cancel_error is not None:
            raise req.cancel_error
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._drive(req, emit), name=f"{self.name}:{req.id}")
        req._task = task
        self._running.add(req)
        timer = None
        if left is not None:
            timer = loop.call_later(left, req._expire)
        # A done-callback, not a finally: it runs even if the task is cancelled before its
        # first step (when the coroutine's own finally blocks never run).
        task.add_done_callback(functools.partial(self._finished, req, timer))
        return task

    def _finished(self, req: Request, timer: asyncio.TimerHandle | None,
                  task: asyncio.Task[Any]) -> None:
        if timer is not None:
            timer.cancel()
        self._running.discard(req)
        if req._task is task:
            req._task = None
        if not task.cancelled():
            task.exception()    # mark retrieved; the caller gets it through _outcome

    async def _drive(self, req: Request, emit: Callable[[Any], Awaitable[None]] | None
                     ) -> Any:
        t0 = time.monotonic()
        await self._admission.acquire()
        req.queue_wait = time.monotonic() - t0
        streams: list[AsyncIterator[Any]] = []
        try:
            value = stream = None
            for stage in self.stages:
                if req.cancelled:   # a stage swallowed its CancelledError: stop here anyway
                    raise asyncio.CancelledError
                if stage.streams:
                    stream = stage.stream(req, stream)
                    streams.append(stream)
                else:
                    value = await stage.run(req)
            if stream is None:
                if emit is not None:
                    await emit(value)
                return value
            out: list[Any] = []
            async for item in stream:
                if req.cancelled:
                    raise asyncio.CancelledError
                if emit is None:
                    out.append(item)
                else:
                    await emit(item)
            return out
        finally:
            # Downstream first: a transform that stopped early (a stop string) leaves its
            # upstream suspended; closing it runs that stage's cleanup (abort the engine's
            # sequence) and frees its slot now.
            for s in reversed(streams):
                try:
                    await s.aclose()
                except Exception:
                    log.exception("closing stage stream for request %s failed", req.id)
            self._admission.release()

    # ---- shutdown -----------------------------------------------------------------------
    async def close(self, timeout: float | None = 0.0) -> None:
        """Stop taking requests (`PipelineClosed`); give those in flight up to `timeout`
        seconds to finish (None: as long as they take), cancel the rest (their callers get
        `PipelineClosed`), then close every stage. Idempotent. Afterwards no task of the
        pipeline or its stages remains."""
        self._closed = True
        pending = {r._task for r in self._running if r._task is not None}
        if pending and (timeout is None or timeout > 0):
            await asyncio.wait(pending, timeout=timeout)
        for req in list(self._running):
            req.cancel(PipelineClosed(f"pipeline {self.name!r} closed"))
        pending = {r._task for r in self._running if r._task is not None}
        if pending:
            await asyncio.wait(pending)
        if not self._stages_closed:
            self._stages_closed = True
            for stage in self.stages:
                await stage.close()

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def _wait_or_cancel(req: Request, task: asyncio.Task[Any]) -> None:
    """Wait for the request's task. If the caller is cancelled meanwhile, cancel the request
    and wait for every stage to unwind (slots released) before re-raising."""
    try:
        await asyncio.wait((task,))
    except asyncio.CancelledError:
        req.cancel("caller cancelled")
        await asyncio.wait((task,))
        raise


def _outcome(req: Request, task: asyncio.Task[Any]) -> Any:
    """The finished task's result, or the request's error (always a PipelineError)."""
    if task.cancelled():
        raise req.cancel_error or RequestCancelled("cancelled")
    exc = task.exception()
    if exc is not None:
        if req.cancel_error is not None and exc is not req.cancel_error:
            # The stage turned its cancellation into some other error; report why it was
            # cancelled, keeping what the stage raised as the cause.
            raise req.cancel_error from exc
        raise exc
    return task.result()


def _check_stages(stages: tuple[Stage, ...]) -> None:
    if not stages:
        raise ValueError("a pipeline needs at least one stage")
    seen: set[str] = set()
    streaming = None
    for s in stages:
        if s.name in seen:
            raise ValueError(f"two stages are named {s.name!r}; names key req.timings")
        seen.add(s.name)
        if s.streams:
            if streaming is not None and not s.accepts_upstream():
                raise TypeError(f"stage {s.name!r} follows streaming stage {streaming!r}, "
                                "so its process must take (req, upstream)")
            streaming = streaming or s.name
        elif streaming is not None:
            raise TypeError(f"stage {s.name!r} does not stream but follows streaming stage "
                            f"{streaming!r}; a stream flows to the end, so every later stage "
                            "must be an async generator taking (req, upstream)")
