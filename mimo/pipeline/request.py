"""Request: the per-request context that flows through a pipeline's stages."""
from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import DeadlineExceeded, PipelineError, RequestCancelled

_ids = itertools.count(1)
_prefix = f"req-{os.getpid():x}-"


def _new_id() -> str:
    return f"{_prefix}{next(_ids)}"


class StageTiming(NamedTuple):
    """Seconds a request spent at one stage: `waited` for a concurrency slot or a batch to
    form, then `ran` (for a BatchStage: its batch's processing; for a streaming stage: until
    its stream ended)."""
    waited: float
    ran: float


@dataclass(eq=False, kw_only=True)
class Request:
    """One request's state: subclass it with typed fields, which the stages read and fill
    (fields are keyword-only, so subclasses may add fields without defaults):

        @dataclass(eq=False, kw_only=True)
        class Doc(Request):
            path: str
            text: str = ""          # the read stage fills it

    Each field has one writer, the stage that declares it as its output; what a stage
    returns is not stored (only the last stage's value is `Pipeline.run`'s result).

    Identity, not equality: two requests with the same data are different requests
    (`eq=False` keeps the default identity hash, so requests can key dicts and sets).

    Times are `time.monotonic()` seconds. `deadline` is absolute; `Request.with_timeout`
    sets it from a duration. The pipeline cancels the request, wherever it is, when the
    deadline passes (`DeadlineExceeded`).
    """
    id: str = field(default_factory=_new_id)
    deadline: float | None = None
    created: float = field(default_factory=time.monotonic)
    # Filled by the pipeline, read by metrics and logs:
    timings: dict[str, StageTiming] = field(default_factory=dict)
    queue_wait: float = 0.0            # seconds waiting for a pipeline slot (max_in_flight)
    stage: str | None = None           # the stage it is in now; None when not in one
    # The first cancellation wins; the pipeline raises this error to the caller.
    _cancel_error: RequestCancelled | PipelineError | None = field(
        default=None, init=False, repr=False)
    # The pipeline task running this request (at most one at a time).
    _task: asyncio.Task[Any] | None = field(default=None, init=False, repr=False)

    @classmethod
    def with_timeout(cls, seconds: float, **fields: Any) -> Request:
        return cls(deadline=time.monotonic() + seconds, **fields)

    @property
    def cancelled(self) -> bool:
        """True once the request was cancelled. Stages doing blocking work in a thread can
        poll this to stop early; async stages just see `asyncio.CancelledError`."""
        return self._cancel_error is not None

    @property
    def cancel_error(self) -> PipelineError | None:
        return self._cancel_error

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def remaining(self) -> float | None:
        """Seconds left before the deadline (may be negative), or None without one."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def cancel(self, reason: str | PipelineError = "cancelled") -> bool:
        """Cancel the request wherever it is: waiting for a pipeline slot, in a stage, queued
        for a batch or streaming. Must be called on the event loop's thread (from another
        thread: `loop.call_soon_threadsafe(req.cancel)`). Returns False when the request was
        already cancelled (the first reason is kept). A request cancelled before it runs
        fails at once when run."""
        if self._cancel_error is not None:
            return False
        if isinstance(reason, PipelineError):
            err = reason
        else:
            err = RequestCancelled(reason, stage=self.stage)
        if err.stage is None:
            err.stage = self.stage
        self._cancel_error = err
        if self._task is not None and not self._task.done():
            self._task.cancel()
        return True

    def _expire(self) -> None:
        """Deadline timer callback."""
        self.cancel(DeadlineExceeded(f"deadline exceeded after "
                                     f"{time.monotonic() - self.created:.3f}s"))
