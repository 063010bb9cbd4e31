"""The pipeline's typed errors: what can happen to one request, as a small hierarchy.

Every failure a caller of `Pipeline.run` / `Pipeline.stream` sees is a `PipelineError`, so
the API layer maps errors to responses in one place. A suggested mapping (the pipeline
itself knows nothing of HTTP; dependencies point api -> pipeline):

    InvalidRequest          400  the client sent something a stage rejects
    RequestCancelled        499  cancelled (client gone, `req.cancel()`)
      DeadlineExceeded      504  the request's deadline passed
    Overloaded              503  backpressure: no room now, retry later
      QueueFull             503  a BatchStage queue is at its `max_queue`
    PipelineClosed          503  the pipeline (or a stage) is shutting down
    StageError              500  a stage raised another exception (`.cause`); 400 when
                                 the cause is a typed client fault (the API's table)

Invariant: a stage's exception becomes an error for *its* request only; other requests,
including those in the same batch, are unaffected.

These are ordinary `Exception`s, never `asyncio.CancelledError`: cancellation of the
*caller's* task stays a `CancelledError` (asyncio's contract), while a request cancelled
from elsewhere (`req.cancel()`, a deadline, `close()`) is a result the caller handles.
"""
from __future__ import annotations


class PipelineError(Exception):
    """Base class. `stage` names the stage the error came from, when one did."""

    def __init__(self, message: str = "", *, stage: str | None = None):
        super().__init__(message)
        self.message = message
        self.stage = stage

    def __str__(self) -> str:
        where = f"[{self.stage}] " if self.stage else ""
        return f"{where}{self.message}"


class InvalidRequest(PipelineError):
    """A stage rejects the request's input (malformed, too large, not allowed). Stages
    raise it for client faults, so they are told apart from bugs (`StageError`)."""


class StageError(PipelineError):
    """A stage raised an exception that is not a `PipelineError`. The original exception is
    `.cause` (and `__cause__`, so tracebacks show both): stages raise typed exceptions and
    do not translate them, so a caller tells a client's fault (its type) from a bug."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}", stage=stage)
        self.cause = cause
        self.__cause__ = cause


class RequestCancelled(PipelineError):
    """The request was cancelled before it finished; `reason` says why. No later stage ran
    for it, and every slot it held (pipeline, stage, batch queue) has been released."""

    def __init__(self, reason: str = "cancelled", *, stage: str | None = None):
        super().__init__(reason, stage=stage)
        self.reason = reason


class DeadlineExceeded(RequestCancelled):
    """The request's deadline passed; it was cancelled wherever it was."""


class Overloaded(PipelineError):
    """No capacity for the request now (backpressure). `retry_after` (seconds) is a hint
    when the raiser has one."""

    def __init__(self, message: str = "overloaded", *, stage: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message, stage=stage)
        self.retry_after = retry_after


class QueueFull(Overloaded):
    """A BatchStage's queue holds `max_queue` requests already."""


class PipelineClosed(PipelineError):
    """The pipeline or stage is closed (or closing): it takes no new requests, and requests
    still running when it closed end with this error."""
