"""ChatRequest: the one typed request the serving stages share. The API fills what to
generate; every later field is written by exactly one stage (named beside it) and read only
by the stages after it, so each stage's inputs and outputs are declared here.

Serving order: fetch -> decode_media -> preprocess -> encode -> prompt -> generate ->
detokenize (a text-only model runs prompt -> generate -> detokenize).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ..engine.sampling_params import SamplingParams
from ..kvcache.radix.namespace import CacheScope
from ..multimodal.decoded import DecodedMedia
from ..multimodal.item import MediaItem
from ..multimodal.mm_prompt import MMPrompt
from ..multimodal.preprocessed import PreprocessedMedia
from ..pipeline import Request

if TYPE_CHECKING:
    import torch

    from ..engine.async_engine import Arrival


class Usage(NamedTuple):
    prompt_tokens: int          # as the model sees them: media placeholders expanded
    completion_tokens: int
    cached_tokens: int          # prompt tokens whose KV came from the prefix cache


@dataclass(eq=False, kw_only=True)
class ChatRequest(Request):
    # What to generate (the API). Exactly one of messages, text and token_ids is set.
    # With `fit_max_tokens` (the client set no max_tokens), params.max_tokens is a cap that
    # generate cuts to the rest of the context: the one later write of `params`.
    params: SamplingParams = field(default_factory=SamplingParams)
    fit_max_tokens: bool = False
    messages: list[dict] | None = None     # content: a string, or text/image/video parts
    text: str | None = None                # a completion's text prompt
    token_ids: list[int] | None = None     # a completion's prompt as token ids
    stop: list[str] = field(default_factory=list)
    media: list[MediaItem] = field(default_factory=list)   # in prompt order
    tools: list[dict] | None = None        # tool definitions shown to the model (OpenAI's shape)
    tool_format: str | None = None         # mimo.tools.FORMATS key, for templates without tools
    # Detokenize with special tokens (a tool or reasoning parser reads their markers); the
    # final EOS / stop token is then left out of the text.
    keep_special: bool = False
    cache: CacheScope = field(default_factory=CacheScope)   # cache salt and session key
    # A decode worker's request: the prefill worker to take its prompt KV from (the router's
    # x-mimo-prefill header; mimo/disagg). None: computed here.
    prefill_url: str | None = None
    # Written by the stages, one writer each:
    fetched: list[bytes] = field(default_factory=list)               # fetch
    decoded: list[DecodedMedia] = field(default_factory=list)        # decode_media
    preprocessed: list[PreprocessedMedia] = field(default_factory=list)   # preprocess
    embeds: list[torch.Tensor] = field(default_factory=list)         # encode
    prompt_ids: list[int] = field(default_factory=list)              # prompt (final ids)
    mm_prompt: MMPrompt | None = None                                # prompt
    cached_tokens: int = 0                                           # generate
    engine_queue_wait: float | None = None  # generate: submit -> admission, seconds
    engine_stream: object = None            # generate: its AsyncEngine RequestStream
    # The responder's note that this request is on its way to the engine (an
    # engine.arrivals.Arrival); generate closes it when it submits (the responder, if not).
    arrival: Arrival | None = None
    completion_tokens: int = 0                                       # detokenize

    @property
    def usage(self) -> Usage:
        return Usage(len(self.prompt_ids), self.completion_tokens, self.cached_tokens)
