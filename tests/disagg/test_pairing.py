"""PD pairing's choices without processes: decode by load and free KV, prefill only among
prefill workers, no pairing while a role has no healthy worker."""
from __future__ import annotations

from mimo.router.pd import DecodeLoad, PDPairing

PRE, D1, D2 = "http://p:1", "http://d:1", "http://d:2"


def test_decode_worker_by_load_and_free_kv():
    pd = PDPairing((PRE,), (D1, D2))
    pd.loads = {D1: DecodeLoad(0, 0, 1.0), D2: DecodeLoad(0, 0, 1.0)}
    assert pd.pick_decode([D1, D2], {D1: 1}) == D2              # in flight here
    assert pd.pick_decode([D1, D2], {D2: 2, D1: 1}) == D1
    pd.loads[D2] = DecodeLoad(0, 0, 0.1)                          # nearly full KV
    assert pd.pick_decode([D1, D2], {}) == D1
    pd.loads[D1] = DecodeLoad(2, 2, 1.0)                          # 4 reported requests
    assert pd.pick_decode([D1, D2], {}) == D2
    pd.loads = {}
    assert {pd.pick_decode([D1, D2], {}) for _ in range(4)} == {D1, D2}   # ties rotate


def test_roles_live_and_exclusions():
    pd = PDPairing((PRE,), (D1, D2))
    healthy = {PRE: True, D1: True, D2: False}
    assert pd.live(healthy, frozenset()) == ([PRE], [D1])
    assert pd.live(healthy, frozenset({D1})) == ([PRE], [])
    assert pd.not_prefill([PRE, D1, D2, "http://w:1"]) == frozenset({D1, D2, "http://w:1"})
    assert not PDPairing((), ()).configured and pd.configured
