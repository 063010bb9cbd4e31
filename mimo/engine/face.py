"""The engine's face: all that code outside engine/ sees of a running engine (the
dependency rule in docs/architecture.md).

`EngineInfo` is built once, before the engine thread starts, and never changes. `EngineStats`
is an immutable snapshot the engine thread builds after each iteration and swaps in whole
(`AsyncEngine.stats`): readers on other threads (metrics, /health, the cache publisher) read
one consistent picture and never touch the scheduler, the pools or the tree themselves.
`fit` is the one rule for whether a request's prompt and max_tokens fit the engine."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import ModelConfig
from .errors import RequestError
from .sequence import TokenLogprob

__all__ = ["ContextTooLong", "EngineInfo", "EngineStats", "SpecTotals", "StorageCounts",
           "TierCounts", "TierStats", "TokenLogprob", "fit"]


class ContextTooLong(RequestError):
    """The prompt with max_tokens (or min_tokens) does not fit the context. `param`: which
    of the request's inputs to blame: 'prompt' or 'min_tokens'."""
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def fit(prompt_len: int, max_tokens: int, max_model_len: int, kv_tokens: int, *,
        fill: bool = False, min_tokens: int = 0) -> int:
    """The max_tokens a request of `prompt_len` tokens runs with, or ContextTooLong.
    `fill`: the client sent no max_tokens, so (as OpenAI) it gets the context's rest, and no
    more than the full pool can ever hold beside the prompt (`kv_tokens`; the engine refuses
    a request that could outgrow an empty pool, and the client asked for no bound)."""
    n, m, limit = prompt_len, max_tokens, max_model_len
    if n >= limit:
        raise ContextTooLong(f"the prompt has {n} tokens; the context is {limit} tokens "
                             f"(it must leave room for one more)", "prompt")
    if fill:
        held = kv_tokens - n
        rest = min(limit - n, m, held) if held >= 1 else min(limit - n, m)
        if min_tokens > rest:
            raise ContextTooLong(f"the prompt ({n} tokens) leaves {rest} of the context of "
                                 f"{limit} tokens, fewer than min_tokens ({min_tokens})",
                                 "min_tokens")
        return rest
    if n + m > limit:
        raise ContextTooLong(f"the prompt ({n} tokens) + max_tokens ({m}) exceeds the context "
                             f"of {limit} tokens", "prompt")
    return m


@dataclass(frozen=True)
class EngineInfo:
    """What a running engine serves, fixed when it starts."""
    model: str                      # the model it loaded (EngineConfig.model)
    arch: str                       # its architecture (ModelConfig.arch)
    model_config: ModelConfig       # the model's declaration (data)
    vocab_size: int
    max_model_len: int              # prompt + output tokens of one request, at most
    stop_ids: frozenset[int]        # end-of-sequence token ids
    tokenizer: Any
    kv_tokens: int                  # tokens of full KV the pool holds (all pages)
    page_size: int
    window: int                     # the SWA window the pools keep (0: no hybrid pools)
    fingerprint: bytes              # identity of the KV it writes (kvcache/tiers/keys.py)
    dtype: str
    device: str
    speculative: str | None         # the drafter, None when off
    vision: Any = None              # the VisionAdapter of a vision-language model
    encoder: Any = None             # its in-process vision encoder (adapter.encoder)

    def check(self, prompt_len: int, max_tokens: int, *, fill: bool = False,
              min_tokens: int = 0) -> int:
        return fit(prompt_len, max_tokens, self.max_model_len, self.kv_tokens, fill=fill,
                   min_tokens=min_tokens)


@dataclass(frozen=True)
class SpecTotals:
    """Speculative decoding since start, summed over requests."""
    steps: int = 0                      # verify steps (one per decoding request and step)
    emitted: int = 0                    # tokens they emitted
    drafted: tuple[int, ...] = ()       # draft tokens proposed, per draft position
    accepted: tuple[int, ...] = ()      # of those, accepted

    @property
    def mean_acceptance_length(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class TierCounts:
    """One lower tier's totals (l2: host memory, l3: storage)."""
    name: str
    hit_tokens: int
    miss_tokens: int
    bytes_read: int
    bytes_written: int
    pages_read: Mapping[str, int]       # by kind: 'f' full, 's' SWA
    pages_written: Mapping[str, int]


@dataclass(frozen=True)
class StorageCounts:
    """The storage tier's failures and lookup latency."""
    errors: Mapping[str, int]           # keys that missed or failed, by cause
    dropped: int                        # pages not written: the queue was full
    refused: int                        # pages the backend did not store
    latency_buckets: tuple[tuple[float, int], ...]   # (upper bound, lookups <= it)
    latency_sum: float


@dataclass(frozen=True)
class TierStats:
    l1_hit_tokens: int
    load_errors: int                    # promotions that raised (the request recomputed)
    tiers: tuple[TierCounts, ...]
    host_pages: Mapping[str, Mapping[str, int]] | None     # by kind, then page state
    storage: StorageCounts | None


@dataclass(frozen=True)
class EngineStats:
    """The engine after its latest iteration."""
    steps: int = 0                      # iterations run
    waiting: int = 0                    # requests queued for admission
    running: int = 0
    uncached_tokens: int = 0            # prompt tokens queued or running not yet computed
    pools: Mapping[str, Mapping[str, int]] = field(default_factory=dict)   # pool -> state -> pages
    preemptions: int = 0
    failed_steps: int = 0
    spec: SpecTotals | None = None      # None: no speculative decoding
    cache: Mapping[str, int] | None = None      # prefix cache counters; None: no cache
    tiers: TierStats | None = None      # None: no tiers below L1
    cpu: str = ""                       # the CPU model
    cpu_flags: frozenset[str] = frozenset()     # its instruction sets mimo's kernels use
    kernels: str = "torch"              # the CPU kernel build in use
    weights: str = "none"               # decode weight format
    dtype: str = ""
    # Requests that arrived with their prompt KV (mimo/disagg's decode role): admitted on
    # it, and run from scratch here instead (a payload this engine could not place).
    kv_imported: int = 0
    kv_import_recomputed: int = 0
