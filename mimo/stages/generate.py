"""generate: hands the built prompt (req.prompt_ids, req.mm_prompt) to the engine thread and
streams back its tokens; keeps req.cached_tokens and req.engine_queue_wait up to date.

The engine's own scheduler does prefix matching, prefill and decode each iteration; this
stage is the boundary. Leaving the stream early (client gone, stop string, deadline) aborts
the request, which frees its KV at the engine's next step. A prompt the engine refuses
raises the engine's RequestError as is (the API maps it).
"""
from __future__ import annotations

from ..engine.async_engine import AsyncEngine
from ..pipeline import Stage
from .chat_request import ChatRequest


class Generate(Stage):
    name = "generate"

    def __init__(self, engine: AsyncEngine):
        super().__init__()
        self.engine = engine

    async def process(self, req: ChatRequest, upstream=None):
        stream = self.engine.submit(req.prompt_ids, req.params, mm=req.mm_prompt)
        finished = False
        try:
            async for ev in stream:
                finished = ev.finish_reason is not None
                _note(req, stream)
                yield ev
        finally:
            _note(req, stream)
            if not finished:
                self.engine.abort(stream)


def _note(req: ChatRequest, stream) -> None:
    """What the engine knows about the request so far (plain reads; the engine thread writes
    them once, at admission)."""
    req.cached_tokens = stream.cached_tokens
    req.engine_queue_wait = stream.seq.queue_wait
