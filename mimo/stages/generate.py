"""generate: hands the built prompt (req.prompt_ids, req.mm_prompt) to the engine thread and
streams back its tokens; keeps req.cached_tokens and req.engine_queue_wait up to date.

The engine's own scheduler does prefix matching, prefill and decode each iteration; this
stage is the boundary. Leaving the stream early (client gone, stop string, deadline) aborts
the request, which frees its KV at the engine's next step. A prompt the engine refuses
raises the engine's RequestError as is (the API maps it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..engine.async_engine import AsyncEngine
from ..engine.face import ContextTooLong, TokenLogprob
from ..pipeline import InvalidRequest, Stage
from .chat_request import ChatRequest


class ContextLengthExceeded(InvalidRequest):
    """The prompt (with max_tokens) does not fit the model's context."""
    code = "context_length_exceeded"

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class Generated:
    """One engine event of a request: its new tokens (and their logprobs when asked)."""
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Generate(Stage):
    name = "generate"

    def __init__(self, engine: AsyncEngine):
        super().__init__()
        self.engine = engine

    def _check_context(self, req: ChatRequest) -> None:
        """The engine's rule (`AsyncEngine.check`), blamed on this request's inputs; with no
        max_tokens sent it sets what the context and the KV pool leave."""
        p = req.params
        try:
            m = self.engine.check(len(req.prompt_ids), p.max_tokens, fill=req.fit_max_tokens,
                                  min_tokens=p.min_tokens)
        except ContextTooLong as e:
            param = e.param if e.param != "prompt" else (
                "messages" if req.messages is not None else "prompt")
            raise ContextLengthExceeded(str(e), param) from None
        if m != p.max_tokens:
            req.params = dataclasses.replace(p, max_tokens=m)

    async def process(self, req: ChatRequest, upstream=None):
        self._check_context(req)
        stream = self.engine.submit(req.prompt_ids, req.params, mm=req.mm_prompt,
                                    scope=req.cache, arrival=req.arrival)
        async for g in self.follow(req, stream):
            yield g

    async def follow(self, req: ChatRequest, stream):
        """The engine stream's events as `Generated`; leaving early aborts the request."""
        req.engine_stream = stream
        finished = False
        seen = 0
        try:
            async for ev in stream:
                finished = ev.finish_reason is not None
                _note(req, stream)
                # The engine thread appended these logprobs before it posted the event.
                lps = stream.seq.logprobs[seen:seen + len(ev.token_ids)]
                seen += len(ev.token_ids)
                yield Generated(list(ev.token_ids), ev.finish_reason, lps)
        finally:
            _note(req, stream)
            if not finished:
                self.engine.abort(stream)


def _note(req: ChatRequest, stream) -> None:
    """What the engine knows about the request so far (plain reads; the engine thread writes
    them once, at admission)."""
    req.cached_tokens = stream.cached_tokens
    req.engine_queue_wait = stream.seq.queue_wait
