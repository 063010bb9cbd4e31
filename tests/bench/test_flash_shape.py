"""flash-shape bench: the scaled config is MiMo-V2-Flash's structure as both transformers and
mimo read it, and one small real run gives the JSON line with every figure."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mimo.bench.flash_shape import QUICK, SHAPE, hf_config
from mimo.models.hf_config import model_config_from_hf

ROOT = Path(__file__).resolve().parents[2]


def test_scaled_config_keeps_the_real_structure():
    cfg = hf_config(SHAPE)
    mc = model_config_from_hf(cfg.to_dict())
    # the real model's first 8 layers: full on 0 and 5
    assert mc.layer_types == ("full", "swa", "swa", "swa", "swa", "full", "swa", "swa")
    assert mc.mlp_types == ("dense",) + ("sparse",) * 7
    assert mc.kv_shape("full") == (1, 192, 128) and mc.kv_shape("swa") == (2, 192, 128)
    assert mc.swa_attention_sink and not mc.full_attention_sink
    assert mc.sliding_window == 129                       # 128 previous tokens + the query
    assert (mc.num_experts, mc.num_experts_per_tok) == (64, 8)
    assert mc.rotary_dim == mc.swa_rotary_dim == int(192 * 0.334)
    assert not mc.tie_word_embeddings
    assert model_config_from_hf(hf_config(QUICK).to_dict()).layer_types == ("full", "swa", "swa", "swa")


def test_quick_run_prints_every_figure():
    cmd = ["nice", "-n", "19", sys.executable, "-m", "mimo.bench", "flash-shape", "--quick",
           "--streams", "1,2", "--prompt-tokens", "12", "--max-tokens", "4",
           "--prefill-tokens", "48", "--reps", "1", "--threads", "1"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["shape"] == QUICK and res["streams"] == [1, 2] and res["threads"] == 1
    assert res["transformers"]["attn_implementation"] == "eager"
    for who in ("mimo", "transformers"):
        r = res[who]
        assert set(r["decode"]) == {"1", "2"}
        assert all(v["decode_tok_s"] > 0 and v["ttft_s"] > 0 for v in r["decode"].values())
        assert r["prefill"]["tokens"] == 48 and r["prefill"]["prefill_tok_s"] > 0
        f = res["fractions"][who]
        assert set(f) == {"decode_1", "decode_2", "prefill"}
        assert all(0 < x["roofline"] == max(x["memory"], x["compute"]) for x in f.values())
    ratios = res["ratios_mimo_over_transformers"]
    assert set(ratios) == {"decode_1", "decode_2", "prefill"}
    assert ratios["prefill"] == round(res["mimo"]["prefill"]["prefill_tok_s"]
                                      / res["transformers"]["prefill"]["prefill_tok_s"], 4)
    assert res["mimo_matches_or_beats"] == {k: v >= 1.0 for k, v in ratios.items()}
    assert all(0 <= v <= 4 for v in res["greedy_agreement"].values())
    assert res["machine"]["matmul_gflops"] > 0 and res["machine"]["bandwidth_gbs"] > 0
