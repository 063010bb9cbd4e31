"""placeholders: one pad token per item expands to the item's row count, kinds must pair up
in order, the cache key depends on the media keys in prompt order, and place_media builds
the MMPrompt the engine reads (rows where the pads are, embeddings in prompt order)."""
import pytest
import torch

from mimo.config import ModelConfig, VisionConfig
from mimo.multimodal.adapter import adapter_for
from mimo.multimodal.placeholders import (
    PlaceholderMismatch,
    expand_placeholders,
    media_cache_key,
    place_media,
)
from mimo.multimodal.preprocess import Patches
from mimo.multimodal.preprocessed import PreprocessedMedia

VC = VisionConfig(depth=1, hidden_size=8, intermediate_size=8, num_heads=1, out_hidden_size=8,
                  image_token_id=5, video_token_id=6, vision_start_token_id=3,
                  vision_end_token_id=4)
PADS = {5: "image", 6: "video"}


def test_expands_each_pad_by_its_count_in_order():
    ids = [1, 3, 5, 4, 2, 3, 6, 4, 3, 5, 4]
    out = expand_placeholders(ids, PADS, ["image", "video", "image"], [2, 3, 1])
    assert out == [1, 3, 5, 5, 4, 2, 3, 6, 6, 6, 4, 3, 5, 4]


@pytest.mark.parametrize("ids,kinds,says", [
    ([3, 5, 4], [], "is nothing"),                      # a pad typed in the text
    ([3, 5, 4], ["video"], "is a video"),
    ([3, 5, 4], ["image", "image"], "1 media placeholders for 2"),
])
def test_mismatch_is_a_typed_client_error(ids, kinds, says):
    with pytest.raises(PlaceholderMismatch, match=says):
        expand_placeholders(ids, PADS, kinds, [1] * len(kinds))


def test_cache_key_follows_media_and_order():
    assert media_cache_key(["a", "b"]) == media_cache_key(["a", "b"])
    assert media_cache_key(["a", "b"]) != media_cache_key(["b", "a"])
    assert media_cache_key(["a"]) != media_cache_key(["b"])


def _qwen_adapter():
    cfg = ModelConfig(arch="qwen2_5_vl", vocab_size=16, hidden_size=8, intermediate_size=8,
                      num_layers=1, num_heads=1, layer_types=("full",), full_kv_heads=1,
                      swa_kv_heads=1, head_dim=8, v_head_dim=8, swa_head_dim=8,
                      swa_v_head_dim=8, sliding_window=64, rope_theta=1e4,
                      rope_local_theta=1e4, vision=VC)
    return adapter_for(cfg)


def test_place_media_puts_each_items_rows_at_its_pads():
    adapter = _qwen_adapter()
    img = PreprocessedMedia("image", "k-img", Patches(torch.zeros(8, 1), (1, 2, 4)), None)
    vid = PreprocessedMedia("video", "k-vid", Patches(torch.zeros(16, 1), (2, 2, 4)), 1.0)
    e_img, e_vid = torch.full((2, 8), 1.0), torch.full((4, 8), 2.0)
    full, mmp = place_media([1, 3, 6, 4, 3, 5, 4, 2], adapter, [vid, img], [e_vid, e_img])
    assert full == [1, 3, 6, 6, 6, 6, 4, 3, 5, 5, 4, 2]
    assert mmp.rows.tolist() == [2, 3, 4, 5, 8, 9]
    assert mmp.embeds[:, 0].tolist() == [2.0] * 4 + [1.0] * 2
    assert mmp.positions.shape == (3, len(full))
    assert mmp.cache_key == media_cache_key(["k-vid", "k-img"])
    assert place_media([1, 2], adapter, [], []) == ([1, 2], None)
    with pytest.raises(PlaceholderMismatch):
        place_media([1, 5, 2], adapter, [], [])
