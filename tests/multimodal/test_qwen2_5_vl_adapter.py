"""The Qwen2.5-VL vision adapter: its processor settings are the checkpoint's
(preprocessor_config.json, read at load time), checked against transformers' image
processor loaded from the same directory; a serving cap only lowers the upper bound; broken
files are refused by name. Its placeholders are what the checkpoint's chat template writes,
and its tower equals the model's own."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.media import media_path
from PIL import Image

from mimo.config import ConfigError, VisionConfig
from mimo.models import registry
from mimo.models.hf_config import vision_preprocessing
from mimo.models.tiny import qwen2_5_vl as tiny
from mimo.multimodal.adapter import adapter_for
from mimo.multimodal.adapters.qwen2_5_vl import Qwen2_5_VLAdapter, processor_settings
from mimo.multimodal.config import MediaConfig
from mimo.multimodal.image import decode_image
from mimo.multimodal.preprocess import preprocess_images

IMAGES = ["astronaut.png", "hubble_deep_field.jpg"]
CUSTOM = {"min_pixels": 100 * 28 * 28, "max_pixels": 300 * 28 * 28,
          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.3, 0.35]}


@pytest.fixture(scope="module")
def custom_dir(tmp_path_factory):
    """The tiny checkpoint with its own pixel bounds and normalization."""
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl_pre")
    tiny.write(d, seed=3)
    pre = json.loads((d / "preprocessor_config.json").read_text())
    (d / "preprocessor_config.json").write_text(json.dumps({**pre, **CUSTOM}))
    return d


def test_checkpoint_preprocessing_matches_transformers(custom_dir):
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    hf = mod.Qwen2VLImageProcessorPil.from_pretrained(str(custom_dir))
    vision = registry.load(str(custom_dir), progress=False).config.vision
    assert (vision.min_pixels, vision.max_pixels) == (CUSTOM["min_pixels"], CUSTOM["max_pixels"])
    s = processor_settings(vision)
    assert s.image_std == tuple(CUSTOM["image_std"]) and s.max_pixels == CUSTOM["max_pixels"]
    imgs = [decode_image(media_path(n).read_bytes(), 1 << 30) for n in IMAGES]
    level = np.repeat(np.array(CUSTOM["image_std"]), 2 * 14 * 14)[None] * 255
    for name, img, got in zip(IMAGES, imgs, preprocess_images(imgs, s)):
        ref = hf(images=[Image.fromarray(img)], return_tensors="np")
        assert got.grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0]), name
        t, h, w = got.grid_thw
        assert CUSTOM["min_pixels"] <= h * w * 14 * 14 <= CUSTOM["max_pixels"], name
        levels = np.abs(got.pixel_values.numpy() - ref["pixel_values"]) * level
        assert levels.max() <= 2.01 and (levels > 0.5).mean() < 0.01, name


def test_serving_cap_only_lowers_the_upper_bound(custom_dir):
    vision = registry.load(str(custom_dir), progress=False).config.vision
    assert processor_settings(vision, MediaConfig(resize_max_pixels=200 * 28 * 28)).max_pixels \
        == 200 * 28 * 28
    assert processor_settings(vision, MediaConfig(resize_max_pixels=10**9)).max_pixels \
        == CUSTOM["max_pixels"]
    with pytest.raises(ConfigError, match="below the checkpoint's min_pixels"):
        processor_settings(vision, MediaConfig(resize_max_pixels=50 * 28 * 28))
    with pytest.raises(ConfigError, match="resize_max_pixels"):
        MediaConfig(resize_max_pixels=0)


def test_without_a_file_the_serving_defaults_stay(tmp_path):
    tiny.write(tmp_path, seed=3)
    (tmp_path / "preprocessor_config.json").unlink()
    vision = registry.load(str(tmp_path), progress=False).config.vision
    assert (vision.min_pixels, vision.max_pixels) == (56 * 56, 28 * 28 * 1280)


def test_transformers_5_size_spelling_and_bad_files():
    v = VisionConfig(depth=1, hidden_size=8, intermediate_size=8, num_heads=1, out_hidden_size=8)
    got = vision_preprocessing(v, {"size": {"shortest_edge": 3136, "longest_edge": 12845056}})
    assert (got.min_pixels, got.max_pixels, got.image_mean) == (3136, 12845056, v.image_mean)
    for bad, match in [({"patch_size": 16}, "patch_size=16"),
                       ({"merge_size": 3}, "merge_size=3"),
                       ({"min_pixels": 10, "max_pixels": 5}, "pixel bounds"),
                       ({"max_pixels": "big"}, "pixel bounds"),
                       ({"image_mean": [0.5, 0.5]}, "image_mean"),
                       ({"image_std": [0.5, 0.0, 0.5]}, "image_std"),
                       ([], "JSON object")]:
        with pytest.raises(ConfigError, match=match):
            vision_preprocessing(v, bad)


def test_adapter_is_registered_and_speaks_the_checkpoints_tokens(custom_dir):
    loaded = registry.load(str(custom_dir), progress=False)
    adapter = adapter_for(loaded.config)
    assert isinstance(adapter, Qwen2_5_VLAdapter)
    tok = loaded.tokenizer
    assert adapter.placeholder_text(tok, "image") == "<|vision_start|><|image_pad|><|vision_end|>"
    assert adapter.placeholder_text(tok, "video") == "<|vision_start|><|video_pad|><|vision_end|>"
    assert tok.encode(adapter.placeholder_text(tok, "video")).count(adapter.pad_token("video")) == 1
    assert adapter.tokens_per_item((2, 4, 6)) == 12
    assert adapter.processor_settings(MediaConfig()) == processor_settings(loaded.config.vision)
    model = registry.build_model(loaded.config, loaded.weights, torch.float32)
    tower = adapter.build_tower(loaded.weights, torch.float32)
    px = torch.randn(16, adapter.patch_dim, generator=torch.Generator().manual_seed(0))
    assert torch.equal(tower(px, [(1, 4, 4)]), adapter.encoder(model)(px, [(1, 4, 4)]))
