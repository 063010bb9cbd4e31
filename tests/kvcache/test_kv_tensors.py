"""KV storage starts zeroed, aligned and independent per layer, in every dtype the pools use."""
import os

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


def _vm_flags(addr: int) -> set[str]:
    """The VmFlags of the mapping that holds `addr` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_large_storage_is_kept_off_huge_pages():
    # numpy's large blocks ask for transparent huge pages; the pool asks for 4 KiB pages back,
    # so a prefill's first writes do not each zero a 2 MiB page.
    kv = KVTensors((LayerKV(1, 256, 256),), slots=16384, dtype=torch.bfloat16)   # 8 MiB
    t = kv.k[0]
    assert "nh" in _vm_flags(t.data_ptr() + t.numel() * t.element_size() // 2)
