"""A request's state inside the engine. Owned by the scheduler; the runner reads it."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from ..kvcache.dual_pool import SeqKV
from .sampling_params import SamplingParams


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
    spec_stats: object = None      # mimo.spec.SpecStats once speculative decoding ran for it

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
        return self.num_computed < len(self.prompt_ids)

    def append(self, token: int) -> None:
        self.output_ids.append(token)
        p = self.params
        if not p.ignore_eos and token in self.eos_ids:
            self.finish_reason = "stop"
        elif token in p.stop_token_ids:
            self.finish_reason = "stop"
        elif len(self.output_ids) >= p.max_tokens:
            self.finish_reason = "length"
