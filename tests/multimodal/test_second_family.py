"""A second, invented vision family served end to end, added as one adapter file: the
`ToyVLAdapter` below (its own placeholder token, patch size, no patch merger, plain 1-D rope
positions, a one-matrix tower) is all the multimodal side needs. Nothing in mimo.api,
mimo.stages, mimo.engine or mimo.multimodal changes for it: the real Server, its HTTP app,
the real pipeline (fetch -> decode_media -> preprocess -> encode -> prompt -> generate ->
detokenize) and the engine serve it once the adapter is registered.

The language model is the tiny Qwen2 LM under the architecture name "toy_vl", without its
vision weights: mimo.models' side of a family (its Architecture) is not this test's subject,
so "toy_vl" borrows the Qwen2 LM's."""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import httpx
import pytest
import torch
from helpers.media import MEDIA_DIR, media_path
from tokenizers import AddedToken

from mimo import LLM, SamplingParams
from mimo.api.app import Server, build_app
from mimo.config import ServerConfig, VisionConfig
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.engine import LLMEngine
from mimo.llm import engine_config
from mimo.models import families, registry
from mimo.models.chat_template import ChatTemplate
from mimo.models.tiny import qwen2_5_vl as tiny
from mimo.multimodal.adapter import VisionAdapter, adapter_for, register_adapter
from mimo.multimodal.config import MediaConfig
from mimo.multimodal.image import decode_image
from mimo.multimodal.mm_prompt import MMPrompt
from mimo.multimodal.preprocess import ProcessorSettings, preprocess_images
from mimo.multimodal.preprocessed import PreprocessedMedia

PLACEHOLDER = "<toy_image>"


# ---- the adapter file of the invented family ---------------------------------------------
class ToyTower(torch.nn.Module):
    """One embedding row per 16x16 patch: a fixed random projection to the LM's width."""

    def __init__(self, vision: VisionConfig, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.proj = torch.randn(vision.patch_dim, vision.out_hidden_size, generator=g) * 0.05

    def forward(self, pixel_values: torch.Tensor, grid_thw) -> torch.Tensor:
        return pixel_values.float() @ self.proj


@register_adapter
class ToyVLAdapter(VisionAdapter):
    arch = "toy_vl"
    kinds = ("image",)

    def placeholder_text(self, tokenizer, kind: str) -> str:
        return PLACEHOLDER

    def pad_token(self, kind: str) -> int:
        return self.vision.image_token_id

    def rope_index(self, prompt_ids: Sequence[int], media: Sequence[PreprocessedMedia]
                   ) -> tuple[torch.Tensor, int]:
        # Plain positions: media tokens count like text, so every rope axis is the index.
        return torch.arange(len(prompt_ids)).expand(3, -1), 0

    def processor_settings(self, media: MediaConfig) -> ProcessorSettings:
        v = self.vision
        return ProcessorSettings(patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                                 temporal_patch_size=v.temporal_patch_size,
                                 min_pixels=v.min_pixels, max_pixels=v.max_pixels,
                                 image_mean=v.image_mean, image_std=v.image_std)

    def build_tower(self, weights: dict, dtype: torch.dtype) -> torch.nn.Module:
        return ToyTower(self.vision).to(dtype)

    def encoder(self, model):
        return self.build_tower({}, torch.float32)
# ---- end of the adapter file -----------------------------------------------------------


@pytest.fixture(scope="module")
def toy_loaded(tmp_path_factory):
    """The tiny Qwen2 LM as "toy_vl": its tokenizer gains the family's placeholder token,
    its config the family's vision settings, and it keeps no vision weights."""
    d = tmp_path_factory.mktemp("toy_vl")
    tiny.write(d, seed=3)
    loaded = registry.load(str(d), progress=False)
    tok = loaded.tokenizer
    tok.backend.add_special_tokens([AddedToken(PLACEHOLDER, special=True, normalized=False)])
    pad = tok.backend.token_to_id(PLACEHOLDER)
    assert pad < loaded.config.vocab_size
    vision = VisionConfig(depth=1, hidden_size=8, intermediate_size=8, num_heads=1,
                          out_hidden_size=loaded.config.hidden_size, patch_size=16,
                          temporal_patch_size=1, spatial_merge_size=1, image_token_id=pad,
                          min_pixels=32 * 32, max_pixels=96 * 96,
                          image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    cfg = dataclasses.replace(loaded.config, arch="toy_vl", vision=vision)
    weights = {k: v for k, v in loaded.weights.items() if not k.startswith("visual.")}
    return registry.LoadedModel(cfg, weights, tok, loaded.source)


@pytest.fixture
def toy_lm(monkeypatch):
    """The model families learn that "toy_vl" is the Qwen2 LM (mimo.models' side of a new
    family: its Architecture; here only its model class is needed)."""
    qwen = families.by_name("qwen2_5_vl")
    monkeypatch.setitem(families.architectures(), "toy_vl",
                        dataclasses.replace(qwen, name="toy_vl", model_types=(), tiny=None))


ASK = "What is in this picture?"


def _expected(toy_loaded, path, max_tokens):
    """The answer built by hand: the template's ids with the placeholder repeated once per
    patch, the toy tower's rows in their place, plain positions."""
    llm = LLM("toy", loaded=toy_loaded, dtype="float32", kv_cache_memory="16MiB",
              progress=False)
    adapter = adapter_for(toy_loaded.config)
    tok = toy_loaded.tokenizer
    (p,) = preprocess_images([decode_image(path.read_bytes(), 1 << 30)],
                             adapter.processor_settings(MediaConfig()))
    t, h, w = p.grid_thw
    ids = ChatTemplate.for_model(tok, "toy_vl").encode(
        tok, [{"role": "user", "content": PLACEHOLDER + ASK}])
    at = ids.index(adapter.pad_token("image"))
    ids = ids[:at] + [ids[at]] * (t * h * w) + ids[at + 1:]
    rows = torch.arange(at, at + t * h * w)
    mm = MMPrompt(torch.arange(len(ids)).expand(3, -1), 0, rows,
                  ToyTower(toy_loaded.config.vision)(p.pixel_values, [p.grid_thw]))
    seq = llm.engine.add_request(ids, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                     ignore_eos=True), mm=mm)
    while llm.engine.has_work():
        llm.engine.step()
    return ids, tok.decode(seq.output_ids)


def test_an_invented_family_is_served_end_to_end(toy_loaded, toy_lm):
    path = media_path("astronaut.png")
    body = {"model": "toy", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": str(path)}},
                {"type": "text", "text": ASK}]}]}

    async def main():
        eng = LLMEngine(engine_config("toy", dtype="float32", kv_cache_memory="16MiB"),
                        loaded=toy_loaded, progress=False)
        ae = AsyncEngine(eng)
        server = Server(ServerConfig(), ae, "toy", MediaConfig(allowed_media_dirs=(MEDIA_DIR,)))
        ae.start()
        try:
            transport = httpx.ASGITransport(app=build_app(server))
            async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                         timeout=120) as c:
                first = await c.post("/v1/chat/completions", json=body)
                again = await c.post("/v1/chat/completions", json=body)
                enc = server.chat_pipeline.encode
                counts = (enc.cache_misses, enc.cache_hits, enc.forwards)
                video = await c.post("/v1/chat/completions", json=body | {"messages": [
                    {"role": "user", "content": [
                        {"type": "video_url",
                         "video_url": {"url": str(media_path("nasa_13013.mp4"))}}]}]})
            return counts, first, again, video
        finally:
            await server.pipeline.close()
            await ae.stop()
    counts, first, again, video = asyncio.run(main())
    assert first.status_code == 200, first.text
    ids, text = _expected(toy_loaded, path, 8)
    got = first.json()
    assert got["choices"][0]["message"]["content"] == text
    assert got["usage"]["prompt_tokens"] == len(ids)
    # The same picture again: the embedding cache answers, the answer is the same.
    assert again.json()["choices"][0]["message"]["content"] == text
    assert counts == (1, 1, 1)      # (misses, hits, encoder forwards)
    # The family takes images only: its video part is the client's fault.
    assert video.status_code == 400
    assert video.json()["error"]["message"] == "this model takes no video parts"
