"""The chat pipeline a server runs, composed from the stages by the model's kind.

Text-only model: tokenize -> generate -> detokenize. Vision-language model: tokenize (with
media placeholders) -> fetch -> decode_media -> preprocess -> encode (batched across
requests, embedding cache first; with `encoder_workers` > 1 in worker processes routed by
the hash ring, each with its own cache) -> mm_prompt (placeholders expanded, MMPrompt built) ->
generate -> detokenize. A request without media passes the media stages with nothing to do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ConfigError, ServerConfig
from ..engine.async_engine import AsyncEngine
from ..media.config import MediaConfig
from ..media.embed_cache import EmbedCache
from ..media.preprocess import ProcessorSettings
from ..pipeline import Pipeline
from ..stages import DecodeMedia, Detokenize, Fetch, Generate, Preprocess, Tokenize
from ..stages.encode import EncodeStage
from ..stages.encoder_pool import EncoderPool
from ..stages.mm_prompt import MMPromptStage


@dataclass
class ChatPipeline:
    pipeline: Pipeline
    encode: EncodeStage | None          # None for a text-only model
    embed_cache: EmbedCache | None      # the in-process cache (None with encoder workers)

    @property
    def multimodal(self) -> bool:
        return self.encode is not None


def placeholders(tokenizer, vision) -> dict[str, str]:
    """What Qwen2.5-VL's chat template writes for an image or a video part."""
    tok = tokenizer.id_to_token
    start, end = tok(vision.vision_start_token_id), tok(vision.vision_end_token_id)
    return {"image": start + tok(vision.image_token_id) + end,
            "video": start + tok(vision.video_token_id) + end}


def processor_settings(vision, media: MediaConfig = MediaConfig()) -> ProcessorSettings:
    """The checkpoint's image preprocessing (patch geometry, pixel bounds, normalization),
    its upper pixel bound lowered to `media.resize_max_pixels` when that is set."""
    hi = vision.max_pixels
    if media.resize_max_pixels is not None:
        hi = min(hi, media.resize_max_pixels)
        if hi < vision.min_pixels:
            raise ConfigError(f"resize_max_pixels={media.resize_max_pixels} is below the "
                              f"checkpoint's min_pixels={vision.min_pixels}")
    return ProcessorSettings(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                             temporal_patch_size=vision.temporal_patch_size,
                             min_pixels=vision.min_pixels, max_pixels=hi,
                             image_mean=vision.image_mean, image_std=vision.image_std)


def build_chat_pipeline(cfg: ServerConfig, engine: AsyncEngine,
                        media: MediaConfig = MediaConfig()) -> ChatPipeline:
    eng = engine.engine
    vision = eng.model_config.vision
    limits = dict(name="chat", max_in_flight=cfg.max_in_flight, max_queued=cfg.max_queued)
    if vision is None:
        stages = [Tokenize(eng.tokenizer, eng.model_config.arch), Generate(engine),
                  Detokenize(eng.tokenizer)]
        return ChatPipeline(Pipeline(stages, **limits), None, None)
    settings = processor_settings(vision, media)    # before any worker starts: may refuse
    cache, pool = None, None
    if cfg.encoder_workers == 1:
        cache = EmbedCache(cfg.embed_cache_bytes)
    else:
        # Each worker process loads the tower and keeps its own cache of the same size.
        threads = max(1, torch.get_num_threads() // cfg.encoder_workers)
        pool = EncoderPool(eng.config.model, cfg.encoder_workers, eng.model.visual.dtype,
                           cfg.embed_cache_bytes, threads)
    encode = EncodeStage(eng.model.encode, patch_dim=vision.patch_dim,
                         merge=vision.spatial_merge_size, cache=cache, pool=pool)
    stages = [Tokenize(eng.tokenizer, eng.model_config.arch, placeholders(eng.tokenizer, vision)),
              Fetch(media), DecodeMedia(media), Preprocess(settings), encode,
              MMPromptStage(vision), Generate(engine), Detokenize(eng.tokenizer)]
    return ChatPipeline(Pipeline(stages, **limits), encode, cache)
