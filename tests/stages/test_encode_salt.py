"""The embedding cache under cache_salt: an image encoded for one salt is never served to a
request under another salt or without one (each encodes it again: the encoder runs), while a
request under the same salt hits (no forward). The embeddings are the same either way."""
import asyncio

import torch
from test_encode import Recorder, tower  # noqa: F401 - the fixture
from test_encode_cache import media

from mimo.kvcache.radix.namespace import CacheScope
from mimo.multimodal.embed_cache import EmbedCache
from mimo.stages import ChatRequest
from mimo.stages.encode import EncodeStage


def test_salted_requests_share_embeddings_only_with_their_salt(tower):  # noqa: F811
    vc, enc = tower
    item = media("key-a", (1, 4, 6), 1)
    rec = Recorder(enc)
    cache = EmbedCache(1 << 20)
    stage = EncodeStage(rec, patch_dim=vc.patch_dim, max_wait_ms=1, cache=cache)

    async def one(salt):
        req = ChatRequest(preprocessed=[item], cache=CacheScope(salt=salt))
        return (await stage.run(req))[0]

    async def main():
        try:
            out = {}
            for salt in ("a", "b", None, "a", "b", None):
                before = stage.forwards
                out.setdefault(salt, []).append((await one(salt), stage.forwards - before))
            return out
        finally:
            await stage.close()

    out = asyncio.run(main())
    alone = enc(item.patches.pixel_values, [item.patches.grid_thw])
    for salt, ((first, f1), (second, f2)) in out.items():
        assert f1 == 1, f"salt {salt!r}: its first request must run the encoder"
        assert f2 == 0, f"salt {salt!r}: its second request must hit"
        torch.testing.assert_close(first, alone, atol=1e-5, rtol=0)
        assert torch.equal(first, second)
    assert rec.calls == [24] * 3 and cache.stats.hits == 3 and len(cache) == 3
