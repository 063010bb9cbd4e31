"""generate: hands the prompt to the engine thread and streams back its tokens.

The engine's own scheduler does prefix matching, prefill and decode each iteration; this
stage is the boundary. Leaving the stream early (client gone, stop string, deadline) aborts
the request, which frees its KV at the engine's next step.
"""
from __future__ import annotations

from ..engine.async_engine import AsyncEngine
from ..engine.engine import RequestError
from ..pipeline import InvalidRequest, Stage


class Generate(Stage):
    name = "generate"

    def __init__(self, engine: AsyncEngine):
        super().__init__()
        self.engine = engine

    async def process(self, req, upstream=None):
        # A multimodal pipeline's mm_prompt stage expanded the ids and built the MMPrompt.
        ids, mm = req.data.get("mm_prompt") or (req.data["tokenize"], None)
        try:
            stream = self.engine.submit(ids, req.data["spec"].params, mm=mm)
        except (RequestError, ValueError) as e:
            raise InvalidRequest(str(e)) from e
        req.data["engine_stream"] = stream
        finished = False
        try:
            async for ev in stream:
                finished = ev.finish_reason is not None
                yield ev
        finally:
            if not finished:
                self.engine.abort(stream)
