"""KV storage starts zeroed, aligned and independent per layer, in every dtype the pools use."""
import pytest
import torch

from mimo.kvcache.pool.kv_tensors import KVTensors
from mimo.kvcache.pool.layout import LayerKV


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_storage_is_zeroed_aligned_and_separate(dtype):
    layers = (LayerKV(4, 192, 128), LayerKV(1, 64, 64), LayerKV(3, 5, 7))
    kv = KVTensors(layers, slots=4099, dtype=dtype)
    tensors = [*kv.k, *kv.v]
    for i, lay in enumerate(layers):
        assert kv.k[i].shape == (4099, lay.kv_heads, lay.k_dim)
        assert kv.v[i].shape == (4099, lay.kv_heads, lay.v_dim)
    for t in tensors:
        assert t.dtype == dtype and t.is_contiguous()
        assert t.data_ptr() % 64 == 0
        assert torch.count_nonzero(t) == 0
    kv.k[0][7] = 1.5                                # writes land in that layer's storage only
    assert torch.count_nonzero(kv.k[0]) == 4 * 192
    assert all(torch.count_nonzero(t) == 0 for t in tensors[1:])
