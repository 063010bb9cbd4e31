"""mm_prompt: one pad token per item expands to the item's merged-token count, kinds must
pair up in order, and the cache key depends on the media keys in prompt order."""
import pytest

from mimo.config import VisionConfig
from mimo.pipeline import InvalidRequest
from mimo.stages.mm_prompt import expand_placeholders, media_cache_key

VC = VisionConfig(depth=1, hidden_size=8, intermediate_size=8, num_heads=1, out_hidden_size=8,
                  image_token_id=5, video_token_id=6, vision_start_token_id=3,
                  vision_end_token_id=4)


def test_expands_each_pad_by_its_count_in_order():
    ids = [1, 3, 5, 4, 2, 3, 6, 4, 3, 5, 4]
    out = expand_placeholders(ids, VC, ["image", "video", "image"], [2, 3, 1])
    assert out == [1, 3, 5, 5, 4, 2, 3, 6, 6, 6, 4, 3, 5, 4]


@pytest.mark.parametrize("ids,kinds,says", [
    ([3, 5, 4], [], "is nothing"),                      # a pad typed in the text
    ([3, 5, 4], ["video"], "is a video"),
    ([3, 5, 4], ["image", "image"], "1 media placeholders for 2"),
])
def test_mismatch_is_invalid_request(ids, kinds, says):
    with pytest.raises(InvalidRequest, match=says):
        expand_placeholders(ids, VC, kinds, [1] * len(kinds))


def test_cache_key_follows_media_and_order():
    assert media_cache_key(["a", "b"]) == media_cache_key(["a", "b"])
    assert media_cache_key(["a", "b"]) != media_cache_key(["b", "a"])
    assert media_cache_key(["a"]) != media_cache_key(["b"])
