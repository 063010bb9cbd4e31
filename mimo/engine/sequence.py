"""A request's state inside the engine. Owned by the scheduler; the runner reads it.
Bookkeeping only: no torch at run time (the generator is created by the engine)."""
from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..kvcache.pool.seq_kv import SeqKV
from ..kvcache.radix.namespace import CacheScope, request_namespace
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from ..multimodal.mm_prompt import MMPrompt


NO_CACHE = object()     # a Sequence.cache_namespace: keep this request out of the prefix cache


class TokenLogprob(NamedTuple):
    """One generated token's log-probability under the target model's raw distribution and
    the top alternatives at its position (most likely first; `SamplingParams.logprobs` many)."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    kv: SeqKV | None = None
    num_computed: int = 0          # tokens whose KV is in the cache
    cached_tokens: int = 0         # prompt tokens reused from the prefix cache
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    arrival: int = 0
    # Tokens whose KV must be computed before decoding: the prompt, or prompt and output
    # so far for a request preempted and resumed (its first chunks are then mostly cache hits).
    prefill_end: int = -1
    preemptions: int = 0
    queued_at: float | None = None     # scheduler clock when it (last) joined the queue
    admitted_at: float | None = None   # scheduler clock when it was (last) admitted
    scope: CacheScope = CacheScope()   # its cache salt and session key

    def __post_init__(self) -> None:
        if self.prefill_end < 0:
            self.prefill_end = len(self.prompt_ids)

    @property
    def cache_namespace(self) -> Hashable:
        """Prefix-cache key space (`request_namespace`): its media hash (token ids alone do
        not say which image a placeholder stands for) and its cache salt; `NO_CACHE` for a
        multimodal prompt without a media hash."""
        key = None
        if self.mm is not None:
            key = getattr(self.mm, "cache_key", None)
            if key is None:
                return NO_CACHE
        return request_namespace(key, self.scope.salt)

    @property
    def queue_wait(self) -> float | None:
        """Seconds spent waiting for admission (None while still waiting)."""
        if self.queued_at is None or self.admitted_at is None:
            return None
        return self.admitted_at - self.queued_at
    # Multimodal prompts (a multimodal.mm_prompt.MMPrompt): 3-D positions and vision embeddings.
    # None for text, which then runs exactly as before.
    mm: MMPrompt | None = None
    spec_stats: object = None      # mimo.spec.SpecStats once speculative decoding ran for it
    # One entry per output token when params.logprobs is set: the decode step appends it
    # before the engine reports the token, so a reader holding the token's index finds it.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # The grammar matcher of params.constraint (the decode step makes it on first use); its
    # state always equals output_ids consumed.
    matcher: Any = None
    # Disaggregated serving: `kv_export` (a kv_export.KVExport) hands the prompt KV over
    # frame by frame as its pages become final; `kv_import` is the transferred payload a
    # request waits with until it is admitted (kv_transfer.py).
    kv_export: Any = None
    kv_import: Any = None

    @property
    def running_kv(self) -> SeqKV:
        """Its pages, which it holds exactly while running: the scheduler sets `kv` on
        admission and clears it when the request finishes or is preempted."""
        assert self.kv is not None, f"request {self.id} holds no pages (not running)"
        return self.kv

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_len(self) -> int:
        """Most tokens this request can ever hold KV for."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_end

    def append(self, token: int) -> None:
        self.output_ids.append(token)
        p = self.params
        if token in self.eos_ids and (not p.ignore_eos or self.matcher is not None):
            self.finish_reason = "stop"     # (under a grammar, the EOS it allowed)
        elif token in p.stop_token_ids:
            self.finish_reason = "stop"
        elif len(self.output_ids) >= p.max_tokens:
            self.finish_reason = "length"
