"""`build_attn_batch` against a brute-force description of each row: the slots a query reads
(its window, its key floor), the padded slot rows and lengths of the decode rows, the lazy
additive mask (0 on a row's own keys, -inf on its padding, None when nothing is padded), the
write slots and the rows written (a window rebuild skips rows below `write_from`)."""
from __future__ import annotations

import random

import pytest
import torch

from mimo.gpu.attention import DECODE_KEY_BUCKET, build_attn_batch


def _rows(r: random.Random):
    rows, row = [], 0
    for h in range(r.randint(1, 6)):
        n = 1 if r.random() < 0.6 else r.randint(2, 40)
        start = r.randint(0, 300)
        floor = r.choice([0, 0, r.randint(0, start)])
        write_from = r.choice([0, 0, r.randint(0, start + n)])
        rows.append((row, start, n, h, floor, write_from))
        row += n
    return rows


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window", [None, 37])
def test_matches_brute_force(seed, window):
    r = random.Random(seed * 2 + (window is None))
    for _ in range(60):
        rows = _rows(r)
        owner = {h: torch.randperm(5000)[:start + n] for _, start, n, h, _, _ in rows}
        b = build_attn_batch(rows, window, lambda h, a, z, o=owner: o[h][a:z], "cpu",
                             torch.bfloat16)
        dec = [x for x in rows if x[2] == 1]
        want_write, want_wrows = [], []
        for row, start, n, h, _, wf in rows:
            for i in range(n):
                if start + i >= wf:
                    want_write.append(int(owner[h][start + i]))
                    want_wrows.append(row + i)
        assert b.write_slots.tolist() == want_write
        if len(want_wrows) == sum(x[2] for x in rows):
            assert b.write_rows is None
        else:
            assert b.write_rows.tolist() == want_wrows
        assert len(b.prefills) == len(rows) - len(dec)
        if not dec:
            assert b.decode_slots is None and b.decode_mask is None
            continue
        lens = []
        for i, (_, start, _, h, floor, _) in enumerate(dec):
            lo = 0 if window is None else max(0, start - window + 1)
            lo = max(lo, min(floor, start))          # the floor never hides the row's own key
            keys = owner[h][lo:start + 1].tolist()
            lens.append(len(keys))
            assert b.decode_slots[i, :len(keys)].tolist() == keys
        L = b.decode_slots.shape[1]
        assert L % DECODE_KEY_BUCKET == 0 and max(lens) <= L < max(lens) + DECODE_KEY_BUCKET
        assert b.decode_lens.tolist() == lens
        assert b.decode_rows.tolist() == [x[0] for x in dec]
        assert b.all_decode == (len(dec) == len(rows) and rows[0][0] == 0)
        mask = b.decode_mask
        if min(lens) == L:
            assert mask is None
            continue
        assert mask.shape == (len(dec), 1, 1, L) and mask.dtype == torch.bfloat16
        for i, n in enumerate(lens):
            assert (mask[i, 0, 0, :n] == 0).all() and (mask[i, 0, 0, n:] == float("-inf")).all()
        assert b.decode_mask is mask                 # built once


def test_no_padding_no_mask():
    owner = torch.arange(1000)
    rows = [(0, DECODE_KEY_BUCKET - 1, 1, 0, 0, 0), (1, 2 * DECODE_KEY_BUCKET - 1, 1, 0, 0, 0)]
    b = build_attn_batch(rows[:1], None, lambda h, a, z: owner[a:z], "cpu", torch.float32)
    assert b.decode_mask is None and b.decode_lens.tolist() == [DECODE_KEY_BUCKET]
    b = build_attn_batch(rows, None, lambda h, a, z: owner[a:z], "cpu", torch.float32)
    assert b.decode_mask is not None and b.decode_mask[0, 0, 0, DECODE_KEY_BUCKET:].isinf().all()
