"""The attention kernels' tests' reference: one query's softmax attention over the keys it
sees, in float64, GQA and an optional sink (a logit that joins the softmax with no value)."""
from __future__ import annotations

import torch


def softmax_attention(q, keys, vals, scale, sink=None) -> torch.Tensor:
    """q [Hq, D], keys [L, Hkv, D], vals [L, Hkv, Dv] -> [Hq, Dv], in float64."""
    Hq, Hkv = q.shape[0], keys.shape[1]
    out = []
    for h in range(Hq):
        g = h // (Hq // Hkv)
        s = (keys[:, g].double() @ q[h].double()) * scale
        if sink is not None:
            s = torch.cat([s, sink[h].double().view(1)])
        out.append(torch.softmax(s, 0)[:keys.shape[0]] @ vals[:, g].double())
    return torch.stack(out)
