"""mimo.pipeline: compose async stages into a request pipeline.

The serving path (fetch -> decode_media -> preprocess -> encode -> tokenize -> decode ->
detokenize) is built from these pieces, and so can yours. A complete, runnable example:
examples/custom_pipeline.py.

The pieces
----------
``Request``
    One request's context, subclassed with typed fields the stages read and fill (each
    field written by one stage): ``id``, optional ``deadline``
    (``Request.with_timeout(s)``), ``timings`` per stage, ``cancelled`` / ``cancel()``.

``Stage``
    One step, run per request. Define ``async def process(self, req)``; it writes its
    output to the request's fields (the last stage's return value is the pipeline's
    result). ``max_concurrency`` bounds how many
    requests are inside it at once (the rest wait in order). Make ``process`` an async
    generator to *stream* (many outputs per request); a streaming stage after another
    takes ``process(self, req, upstream)`` and iterates ``upstream``.

``BatchStage``
    Cross-request batching. Define ``async def process_batch(self, reqs) -> list`` (one
    result or exception instance per request, in order) and optionally ``cost(req)``.
    Concurrent callers are grouped up to ``max_batch_size`` requests or
    ``max_batch_cost`` total cost, waiting at most ``max_wait_ms`` for companions; each
    caller gets back its own result.

``Pipeline(stages, max_in_flight=..., max_queued=..., queue_timeout=...)``
    ``await p.run(req)`` -> the last stage's value; ``async for x in p.stream(req)`` -> the
    last stage's items; ``req.cancel()``; ``await p.close()`` (or ``async with``).

Minimal example::

    import asyncio, pathlib
    from dataclasses import dataclass
    from mimo.pipeline import BatchStage, Pipeline, Request, Stage

    @dataclass(eq=False, kw_only=True)
    class Doc(Request):
        path: str
        text: str = ""              # Read fills it

    class Read(Stage):
        max_concurrency = 8
        async def process(self, req: Doc):
            req.text = await asyncio.to_thread(pathlib.Path(req.path).read_text)

    class Embed(BatchStage):
        max_batch_size, max_batch_cost, max_wait_ms = 16, 4096, 5
        def cost(self, req: Doc):
            return len(req.text)
        async def process_batch(self, reqs: list[Doc]):
            return await asyncio.to_thread(my_model.embed, [r.text for r in reqs])

    async def main(paths):
        async with Pipeline([Read(), Embed()], max_in_flight=64) as p:
            return await asyncio.gather(*(p.run(Doc(path=x)) for x in paths),
                                        return_exceptions=True)

The contract, and the guarantees
--------------------------------
* Stages run in order; a request's stage N+1 starts after its stage N returned. Different
  requests overlap freely, within each stage's ``max_concurrency``.
* Never block the event loop: blocking work goes to a thread (``asyncio.to_thread``) or
  a process pool. The loop must keep serving other requests (and /health).
* Errors are per request. ``raise InvalidRequest(...)`` for bad client input; any other
  exception becomes ``StageError(stage, cause)``, keeping the typed exception as
  ``cause``. Either fails only that request: the pipeline and the other requests (also
  those in the same batch) carry on. Callers of ``run``/``stream`` see only
  ``PipelineError`` subclasses (errors.py); stages do not translate errors, the API layer
  maps them (and their causes) to HTTP responses in one place.
* Cancellation (``req.cancel()``, the deadline, ``close()``, or the caller's task being
  cancelled) reaches the stage the request is in as ``asyncio.CancelledError``: release
  what you hold in ``finally`` and let it propagate. A request cancelled while queued for a
  batch never reaches ``process_batch``. No later stage runs. Every slot it held is free
  when ``run`` raises ``RequestCancelled`` (``DeadlineExceeded`` for deadlines,
  ``PipelineClosed`` for ``close()``). Threads cannot be interrupted: poll
  ``req.cancelled`` in long blocking work.
* Backpressure: beyond ``max_in_flight``, requests wait (or, past ``max_queued`` /
  ``queue_timeout``, fail with ``Overloaded``). A slow stream consumer pauses the stream.
* ``close()`` cancels what is still running, stops every BatchStage's collector and
  leaves no task behind.
"""
from .batch_stage import BatchStage
from .errors import (
                     DeadlineExceeded,
                     InvalidRequest,
                     Overloaded,
                     PipelineClosed,
                     PipelineError,
                     QueueFull,
                     RequestCancelled,
                     StageError,
)
from .pipeline import Pipeline
from .request import Request, StageTiming
from .stage import FunctionStage, Stage

__all__ = [
    "BatchStage", "DeadlineExceeded", "FunctionStage", "InvalidRequest", "Overloaded",
    "Pipeline", "PipelineClosed", "PipelineError", "QueueFull", "Request",
    "RequestCancelled", "Stage", "StageError", "StageTiming",
]
