"""The chat pipeline a server runs, composed from the stages by the model's kind, and the
typed request it runs (`chat_request(spec)`).

Text-only model: prompt -> generate -> detokenize. Vision-language model: fetch ->
decode_media -> preprocess (on the serving device) -> encode (batched across requests,
embedding cache first; with `encoder_workers` > 1 in worker processes routed by the hash
ring, each with its own cache; with `encoder_urls` in remote `--role encoder` workers) ->
prompt (template, tokens, media placeholders expanded, MMPrompt built: once, after the
encoder) -> generate -> detokenize. A request without media
passes the media stages with nothing to do. What is particular to the model's vision family
comes from its `VisionAdapter` (mimo.multimodal.adapter_for).
"""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import torch

from ..config import ServerConfig
from ..engine.async_engine import AsyncEngine
from ..multimodal.adapter import VisionAdapter
from ..multimodal.config import MediaConfig
from ..multimodal.embed_cache import EmbedCache
from ..multimodal.embed_store import LayeredEmbedCache, ShmSpec, make_embed_cache, tower_fingerprint
from ..multimodal.encoder_pool import EncoderPool
from ..multimodal.placeholders import expand_placeholders, pad_kinds
from ..pipeline import Pipeline, Stage
from ..stages import (
    BuildPrompt,
    ChatRequest,
    DecodeMedia,
    Detokenize,
    EncodeStage,
    Fetch,
    Generate,
    Preprocess,
)
from .schemas import GenerationSpec


@dataclass
class ChatPipeline:
    pipeline: Pipeline
    encode: EncodeStage | None          # None for a text-only model
    # the in-process cache (None with encoder workers; layered over a shared segment with
    # --encoder-shm-cache-mb)
    embed_cache: EmbedCache | LayeredEmbedCache | None
    prompt: BuildPrompt                 # the prompt stage (/tokenize runs it alone)

    @property
    def multimodal(self) -> bool:
        return self.encode is not None

    async def prompt_ids_with_media(self, req: ChatRequest,
                                    add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids of a chat with media as generation builds them (each item's
        placeholder expanded to its rows), for /tokenize: the media stages before the
        encoder run (the row counts come from preprocessing), the encoder does not."""
        for st in self.pipeline.stages:
            if st is self.encode:
                break
            await st.process(req)
        ids = await asyncio.to_thread(self.prompt.tokenize, req, add_generation_prompt)
        adapter = self.prompt.adapter
        assert adapter is not None      # media parse only for a multimodal model
        pre = req.preprocessed
        return expand_placeholders(ids, pad_kinds(adapter), [m.kind for m in pre],
                                   [adapter.tokens_per_item(m.patches.grid_thw) for m in pre])


def chat_request(spec: GenerationSpec, sample: int = 0, keep_special: bool = False
                 ) -> ChatRequest:
    """The pipeline's request for a parsed OpenAI body: its `sample`-th choice (of n), whose
    seed, when one is given, is seed + sample (each choice reproducible on its own).
    `keep_special`: its text keeps special tokens (a tool or reasoning parser reads it)."""
    params = spec.params
    if sample and params.seed is not None:
        params = dataclasses.replace(params, seed=(params.seed + sample) % 2**64)
    tools = spec.tools
    return ChatRequest(params=params, messages=spec.messages, text=spec.prompt,
                       token_ids=spec.prompt_ids, stop=spec.stop, media=spec.media,
                       fit_max_tokens=spec.fit_max_tokens,
                       tools=tools.template_tools() if tools is not None and tools.active
                       else None,
                       keep_special=keep_special, cache=spec.cache)


def _encoders(cfg: ServerConfig, info, adapter: VisionAdapter):
    """(in-process cache, None) or (None, encoder processes: local or remote workers)."""
    shm = (ShmSpec(cfg.encoder_shm_name, cfg.encoder_shm_cache_mb * 2**20)
           if cfg.encoder_shm_cache_mb else None)
    if cfg.encoder_urls:
        from ..multimodal.remote_encoders import RemoteEncoders
        return None, RemoteEncoders(cfg.encoder_urls, tower_fingerprint(info.encoder, info.dtype),
                                    getattr(torch, info.dtype), adapter.merge,
                                    cfg.encoder_routing, cfg.api_key)
    if cfg.encoder_workers == 1:
        fp = tower_fingerprint(info.encoder, info.dtype) if shm else ""
        return make_embed_cache(cfg.embed_cache_bytes, shm, fp), None
    # Each worker process loads the tower and keeps its own cache of the same size.
    threads = max(1, torch.get_num_threads() // cfg.encoder_workers)
    return None, EncoderPool(info.model, cfg.encoder_workers, getattr(torch, info.dtype),
                             cfg.embed_cache_bytes, threads, shm)


def build_chat_pipeline(cfg: ServerConfig, engine: AsyncEngine,
                        media: MediaConfig | None = None, generate: Stage | None = None
                        ) -> ChatPipeline:
    """`generate`: the generate stage (default `Generate(engine)`)."""
    info = engine.info
    media = media or MediaConfig()
    adapter: VisionAdapter | None = info.vision
    generate = generate or Generate(engine)

    def pipeline(stages: list[Stage]) -> Pipeline:
        return Pipeline(stages, name="chat", max_in_flight=cfg.max_in_flight,
                        max_queued=cfg.max_queued)
    if adapter is None:
        prompt = BuildPrompt(info.tokenizer, info.arch)
        return ChatPipeline(pipeline([prompt, generate, Detokenize(info.tokenizer, info.stop_ids)]),
                            None, None, prompt)
    settings = adapter.processor_settings(media)    # before any worker starts: may refuse
    cache, pool = _encoders(cfg, info, adapter)
    encode = EncodeStage(info.encoder, patch_dim=adapter.patch_dim,
                         merge=adapter.merge, cache=cache, pool=pool)
    prompt = BuildPrompt(info.tokenizer, info.arch, adapter)
    stages = [Fetch(media), DecodeMedia(media), Preprocess(settings, info.device), encode,
              prompt, generate, Detokenize(info.tokenizer, info.stop_ids)]
    return ChatPipeline(pipeline(stages), encode, cache, prompt)
