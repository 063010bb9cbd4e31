"""Offline API in the style of vLLM:

    from mimo import LLM, SamplingParams
    llm = LLM("gemma-3-270m")
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))
    print(outs[0].text, outs[0].token_ids, outs[0].cached_tokens)
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from .config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    RuntimeConfig,
    SchedulerConfig,
    SpecConfig,
    TierConfig,
    parse_size,
)
from .engine.engine import LLMEngine
from .engine.errors import RequestError
from .engine.parts import EngineParts
from .engine.sampling_params import SamplingParams
from .engine.sequence import TokenLogprob


@dataclass
class GenerationOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    cached_tokens: int
    finish_reason: str | None
    # Speculative decoding only (else None): SpecStats.as_dict() of this request, e.g.
    # mean_acceptance_length (tokens per verify step) and position_rate (per draft position).
    spec_stats: dict | None = None
    # SamplingParams.logprobs set (else None): one TokenLogprob (token, logprob, top
    # alternatives) per generated token, from the target model's raw distribution, the same
    # values the server reports (also under speculative decoding).
    logprobs: list[TokenLogprob] | None = None


def engine_config(model: str, **opts: Any) -> EngineConfig:
    """Flat keyword options -> the layered EngineConfig; unknown names are rejected."""
    groups = {CacheConfig: {}, SchedulerConfig: {}, RuntimeConfig: {}, SpecConfig: {},
              TierConfig: {}}
    top = {}
    for k, v in opts.items():
        for cls, bucket in groups.items():
            if k in {f.name for f in fields(cls)}:
                sized = k in ("kv_cache_memory", "host_kv_cache_memory", "kv_disk_cap")
                bucket[k] = parse_size(v) if sized and v is not None else v
                break
        else:
            if k in ("max_model_len", "seed"):
                top[k] = v
            else:
                raise ConfigError(f"unknown option {k!r}")
    return EngineConfig(model=model, cache=CacheConfig(**groups[CacheConfig]),
                        scheduler=SchedulerConfig(**groups[SchedulerConfig]),
                        runtime=RuntimeConfig(**groups[RuntimeConfig]),
                        spec=SpecConfig(**groups[SpecConfig]),
                        tiers=TierConfig(**groups[TierConfig]), **top)


class LLM:
    def __init__(self, model: str = "gemma-3-270m", progress: bool = True, *,
                 loaded=None, parts: EngineParts | None = None, **opts: Any):
        """`model`: a built-in name, a .gguf file or a Hugging Face directory. `loaded`: an
        already loaded `registry.LoadedModel` (tiny test models built in code). `parts`:
        replaces the engine loop's prefix cache, prefill planner or decode step
        (`mimo.engine.parts.EngineParts`)."""
        self.engine = LLMEngine(engine_config(model, **opts), loaded=loaded, progress=progress,
                                parts=parts)
        self.tokenizer = self.engine.tokenizer

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("prompt is empty")
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer; pass prompt_token_ids")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and set(prompt) == {"prompt_token_ids"}:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)):
                raise RequestError("prompt_token_ids must be a list of integers")
            return None, list(ids)
        raise RequestError("a prompt is a string or {'prompt_token_ids': [...]}")

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[GenerationOutput]:
        if isinstance(prompts, (str, dict)) or not isinstance(prompts, Iterable):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, Iterable) and not isinstance(params, SamplingParams) \
            else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        parsed = [self._prompt_ids(p) for p in prompts]   # all validated before any is queued
        seqs = []
        try:
            for (_, ids), p in zip(parsed, plist):
                seqs.append(self.engine.add_request(ids, p))
            while any(s.finish_reason is None for s in seqs):
                self.engine.step()
        finally:
            for s in seqs:
                self.engine.abort(s)
        return [GenerationOutput(text, ids, list(s.output_ids),
                                 self.tokenizer.decode(s.output_ids) if self.tokenizer else "",
                                 s.cached_tokens,
                                 s.finish_reason,
                                 s.spec_stats.as_dict() if s.spec_stats is not None else None,
                                 list(s.logprobs) if s.params.logprobs is not None else None)
                for (text, ids), s in zip(parsed, seqs)]
