"""EncodeStage: concurrent requests' media go through one encoder forward under the patch
budget, and each request gets exactly the embeddings it would get alone (the vision tower on
its own items, checked against transformers in tests/models/test_qwen2_5_vl.py)."""
import asyncio

import pytest
import torch

from mimo.config import VisionConfig
from mimo.models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer
from mimo.models.tiny.qwen2_5_vl import vision_weights
from mimo.pipeline import InvalidRequest
from mimo.stages import ChatRequest
from mimo.stages.encode import EncodeStage

SHAPE = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24,
             patch_size=14, temporal_patch_size=2, spatial_merge_size=2, in_channels=3)


@pytest.fixture(scope="module")
def tower():
    vc = VisionConfig(**SHAPE, fullatt_block_indexes=(1,), window_size=56)
    w = vision_weights(SHAPE, torch.Generator().manual_seed(0), prefix="visual.")
    return vc, Qwen2_5_VisionTransformer(vc, w, torch.float32)


class Recorder:
    """The encoder, recording the patch count of every forward."""

    def __init__(self, tower):
        self.tower, self.calls = tower, []

    def __call__(self, px, grids):
        self.calls.append(int(px.shape[0]))
        return self.tower(px, grids)


def _item(grid, seed):
    n = grid[0] * grid[1] * grid[2]
    return {"pixel_values": torch.randn(n, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(seed)),
            "grid_thw": grid}


def _run(stage, reqs):
    async def main():
        try:
            return await asyncio.gather(*(stage.run(r) for r in reqs), return_exceptions=True)
        finally:
            await stage.close()
    return asyncio.run(main())


def test_batched_requests_get_their_own_embeddings(tower):
    vc, enc = tower
    media = [[_item((1, 4, 6), 1)], [_item((2, 4, 4), 2), _item((1, 8, 4), 3)], [],
             [_item((1, 6, 6), 4)]]
    rec = Recorder(enc)
    stage = EncodeStage(rec, patch_dim=vc.patch_dim, max_wait_ms=50)
    reqs = [ChatRequest(preprocessed=m) for m in media]
    out = _run(stage, reqs)
    assert rec.calls == [24 + 32 + 32 + 36]          # one forward for all four requests
    for m, got, req in zip(media, out, reqs):
        assert req.embeds is got if m else got == []
        assert len(got) == len(m)
        for item, e in zip(m, got):
            alone = enc(item["pixel_values"], [item["grid_thw"]])
            torch.testing.assert_close(e, alone, atol=1e-5, rtol=0)


def test_patch_budget_cuts_batches(tower):
    vc, enc = tower
    rec = Recorder(enc)
    stage = EncodeStage(rec, patch_dim=vc.patch_dim, max_batch_cost=64, max_wait_ms=50)
    reqs = [ChatRequest(preprocessed=[_item((1, 4, 8), i)]) for i in range(5)]   # 32 each
    _run(stage, reqs)
    assert rec.calls == [64, 64, 32]


def test_bad_media_fails_only_its_request(tower):
    vc, enc = tower
    good = _item((1, 4, 4), 0)
    bad_grid = {"pixel_values": good["pixel_values"], "grid_thw": (1, 3, 4)}
    bad_rows = {"pixel_values": good["pixel_values"][:5], "grid_thw": (1, 4, 4)}
    stage = EncodeStage(Recorder(enc), patch_dim=vc.patch_dim, max_wait_ms=50)
    out = _run(stage, [ChatRequest(preprocessed=[m]) for m in (good, bad_grid, bad_rows)])
    assert isinstance(out[0], list) and len(out[0]) == 1
    assert isinstance(out[1], InvalidRequest) and isinstance(out[2], InvalidRequest)
