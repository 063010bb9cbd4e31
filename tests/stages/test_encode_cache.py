"""EncodeStage with an EmbedCache over the preprocess stage's real output
(PreprocessedMedia): a cached item skips the encoder, the same item sent by two requests in
one batch is encoded once, and the embeddings equal an uncached run."""
import asyncio

import torch
from test_encode import Recorder, tower  # noqa: F401 - the fixture

from mimo.multimodal.embed_cache import EmbedCache
from mimo.multimodal.preprocess import Patches
from mimo.multimodal.preprocessed import PreprocessedMedia
from mimo.stages import ChatRequest
from mimo.stages.encode import EncodeStage


def media(key, grid, seed):
    n = grid[0] * grid[1] * grid[2]
    px = torch.randn(n, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(seed))
    return PreprocessedMedia("image", key, Patches(px, grid), None)


async def run(stage, groups):
    """One batch: the groups' requests arrive together."""
    reqs = [ChatRequest(preprocessed=g) for g in groups]
    return await asyncio.gather(*(stage.run(r) for r in reqs))


def test_cache_hits_skip_the_encoder_and_equal_items_encode_once(tower):  # noqa: F811
    vc, enc = tower
    a, b = media("key-a", (1, 4, 6), 1), media("key-b", (1, 4, 4), 2)
    rec = Recorder(enc)
    cache = EmbedCache(1 << 20)
    stage = EncodeStage(rec, patch_dim=vc.patch_dim, max_wait_ms=50, cache=cache)
    asyncio.run(check(stage, rec, cache, enc, a, b))


async def check(stage, rec, cache, enc, a, b):
    first = await run(stage, [[a], [a, b]])
    assert rec.calls == [24 + 16] and stage.forwards == 1      # a once, though asked twice
    assert cache.stats.misses == 3 and cache.stats.hits == 0 and len(cache) == 2
    for got, item in ((first[0][0], a), (first[1][0], a), (first[1][1], b)):
        alone = enc(item.patches.pixel_values, [item.patches.grid_thw])
        torch.testing.assert_close(got, alone, atol=1e-5, rtol=0)
    again = await run(stage, [[b, a]])
    assert rec.calls == [40] and stage.forwards == 1            # all hits: no forward
    assert cache.stats.hits == 2
    assert torch.equal(again[0][0], first[1][1]) and torch.equal(again[0][1], first[0][0])
    c = media("key-c", (1, 4, 4), 3)
    await run(stage, [[a, c]])
    await stage.close()
    assert rec.calls == [40, 16] and stage.forwards == 2        # only the new item
