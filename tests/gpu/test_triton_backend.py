"""TritonAttention (mimo/gpu/triton_attention.py) against the torch backend on real DualPool
steps, and the choice of backend (`--attention-backend`).

The steps are test_paged_metadata's: scattered pages from grow / release_window / truncate /
free, both pools and the full-kv layout, prefill chunks over cached prefixes, decodes, verify
chunks (split into one-query rows and as one causal entry), window rebuilds (key floors, the
prefix cache's full pages read and not written), in batches that mix them. TorchAttention
runs on the runner's AttnBatch, Triton (interpreted on CPU, float32) on the paged metadata:
outputs within 2e-5, caches written identically.
"""
from __future__ import annotations

import random

import pytest
import torch
from test_paged_metadata import HQ, W, chunk, commit, make_pool, new_seq, rebuild_seq

from mimo.config import ConfigError, RuntimeConfig
from mimo.engine.runner import ModelRunner
from mimo.gpu.attention import TorchAttention
from mimo.gpu.backends import make_backend, resolve_backend
from mimo.gpu.paged_metadata import build_paged_metadata

TOL = dict(atol=2e-5, rtol=2e-5)


def check_step(pool, chunks, backend, sinks, split, seed, device="cpu"):
    """The torch reference on the CPU pool; Triton on `device` (copies of the caches and of
    q/k/v there, the metadata built there), compared back on the CPU."""
    runner = ModelRunner(torch.nn.Linear(1, 1), pool, ("full", "swa"), W)
    _, _, ctx, _, _ = runner.prepare(chunks, all_logits=True)
    metas = build_paged_metadata(chunks, pool, W, swa_sinks=sinks, split_verify=split,
                                 device=device)
    for m in metas.values():        # the host copies the kernels' launch reads
        assert m.max_qo_len == int((m.qo_indptr[1:] - m.qo_indptr[:-1]).max())
        assert m.max_kv_len == int(m.kv_len.max())
    T = sum(c.n for c in chunks)
    g = torch.Generator().manual_seed(seed)
    for kind, (kc, vc) in zip(("full", "swa"), runner.kv):
        hkv, d, dv = kc.shape[1], kc.shape[2], vc.shape[2]
        q, k, v = (torch.randn(T, h, x, generator=g) for h, x in ((HQ, d), (hkv, d), (hkv, dv)))
        sk = torch.randn(HQ, generator=g) * 2 if kind == "swa" and sinks else None
        ka, va = kc.clone(), vc.clone()
        kb, vb = kc.to(device, copy=True), vc.to(device, copy=True)
        want = TorchAttention().forward(q, k, v, ka, va, ctx.batches[kind], d ** -0.5, sk)
        dev = [x.to(device) if x is not None else None for x in (q, k, v, sk)]
        got = backend.forward(dev[0], dev[1], dev[2], kb, vb, metas[kind], d ** -0.5, dev[3])
        torch.testing.assert_close(got.cpu(), want, **TOL)
        assert torch.equal(ka, kb.cpu()) and torch.equal(va, vb.cpu()), \
            f"{kind} cache writes differ"
    return metas


@pytest.mark.parametrize("hybrid", [True, False])
@pytest.mark.parametrize("seed", range(2))
def test_triton_backend_random_steps_match_torch(seed, hybrid, triton_device):
    from mimo.gpu.triton_attention import TritonAttention
    # Pieces of at least 16 keys, at most 3: decodes here split into 1 to 3 pieces.
    backend = TritonAttention(num_splits=3, min_split_keys=16, block_n=16)
    rnd = random.Random(seed)
    pool = make_pool(full_pages=64, swa_pages=48, hybrid=hybrid, seed=seed)
    live, nid, kinds, rebuild = [], 0, set(), None
    if hybrid:
        donor = new_seq(pool, 99, seed=seed)
        commit(pool, chunk(pool, donor, 24))
        rebuild = rebuild_seq(pool, 98, donor, floor=rnd.choice([8, 10, 16]), cached_to=24)
        rebuild.prefill_end = 36
        live.append(rebuild)
    for step in range(12):
        # Arrivals stop after step 6, so the last steps are all decodes (the decode kernel).
        if not live or (step < 6 and len(live) < 4 and rnd.random() < 0.6):
            s = new_seq(pool, nid, seed=seed)
            s.prefill_end = rnd.randint(1, 24)
            live.append(s)
            nid += 1
        chunks = []
        for s in rnd.sample(live, len(live)):
            if s.num_computed < s.prefill_end:
                n = rnd.randint(1, min(9, s.prefill_end - s.num_computed))
                chunks.append(chunk(pool, s, n))
                kinds.add("rebuild" if s is rebuild else "prefill")
            else:
                d = [rnd.randint(3, 299) for _ in range(rnd.choice([0, 0, 1, 3]))]
                chunks.append(chunk(pool, s, 1 + len(d), d))
                kinds.add("verify" if d else "decode")
        split = rnd.random() < 0.5
        metas = check_step(pool, chunks, backend, sinks=seed % 2 == 0, split=split,
                           seed=seed * 100 + step, device=triton_device)
        kinds.add("all_decode" if metas["full"].all_decode else "mixed")
        for c in chunks:
            commit(pool, c, rnd.randint(1, c.n) if c.draft else None)
        for s in [s for s in live if s is not rebuild and s.num_computed > 40]:
            live.remove(s)
            pool.free_seq(s.kv)
    assert {"prefill", "decode", "verify", "mixed", "all_decode"} <= kinds
    assert hybrid <= ("rebuild" in kinds)


def test_triton_backend_refuses_attn_batch(triton_device):
    from mimo.gpu.triton_attention import TritonAttention
    pool = make_pool()
    s = new_seq(pool, 0)
    runner = ModelRunner(torch.nn.Linear(1, 1), pool, ("full", "swa"), W)
    _, _, ctx, _, _ = runner.prepare([chunk(pool, s, 3)], all_logits=True)
    kc, vc = runner.kv[0]
    q = torch.randn(3, HQ, kc.shape[2])
    with pytest.raises(TypeError, match="PagedAttnMeta"):
        TritonAttention().forward(q, q[:, :1], q[:, :1], kc, vc, ctx.batches["full"], 1.0)


def test_triton_runner_builds_paged_metadata(triton_device):
    """A runner over the Triton backend hands each kind its paged metadata."""
    from mimo.gpu.paged_metadata import PagedAttnMeta
    from mimo.gpu.triton_attention import TritonAttention
    pool = make_pool()
    s = new_seq(pool, 0)
    runner = ModelRunner(torch.nn.Linear(1, 1), pool, ("full", "swa"), W,
                         backend=TritonAttention())
    _, _, ctx, _, _ = runner.prepare([chunk(pool, s, 5)], all_logits=True)
    assert set(ctx.batches) == {"full", "swa"}
    assert all(isinstance(b, PagedAttnMeta) for b in ctx.batches.values())
    assert ctx.batches["swa"].window_left == W - 1 and ctx.batches["full"].window_left == -1


# ---- choosing the backend ------------------------------------------------------------------
def test_cpu_backend_choice(monkeypatch):
    import mimo.gpu.backends as backends
    assert resolve_backend("torch", "cpu") == "torch"
    # cpu (auto's choice on CPU): the C++ kernels, where they load; refused where they do not
    assert resolve_backend("auto", "cpu") == "cpu"
    assert type(make_backend("auto", "cpu")).__name__ == "CPUAttention"
    assert type(make_backend("cpu", "cpu")).__name__ == "CPUAttention"
    monkeypatch.setattr(backends, "_cpu_kernels", lambda: False)
    with pytest.raises(ValueError, match="did not build or load"):
        resolve_backend("cpu", "cpu")
    assert resolve_backend("auto", "cpu") == "torch"
    assert type(make_backend("auto", "cpu")).__name__ == "TorchAttention"


def test_triton_backend_choice(monkeypatch, triton_device):
    import mimo.gpu.backends as backends
    # The interpreter (set for these tests on a machine without CUDA) lets triton run on
    # CPU tensors ...
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("triton", "cpu") == "triton"
    assert make_backend("triton", "cpu").paged
    # ... without it, CPU is refused, naming the reason.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_backend("triton", "cpu")
    # auto picks triton on a CUDA device when triton imports, else torch.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_backend("auto", "cuda") == "triton"
    assert resolve_backend("auto", "cpu") in ("cpu", "torch")    # never triton on CPU
    monkeypatch.setattr(backends, "_triton_importable", lambda: False)
    assert resolve_backend("auto", "cuda") == "torch"
    with pytest.raises(ValueError, match="triton package does not import"):
        resolve_backend("triton", "cuda")


def test_triton_backend_flag_and_refusals():
    import importlib.util

    from mimo import LLM
    from mimo.flags import add_engine_flags, engine_opts
    with pytest.raises(ValueError, match="one of auto, torch, triton, cpu, flashinfer"):
        resolve_backend("cudnn", "cpu")
    with pytest.raises(ConfigError, match="attention_backend"):
        RuntimeConfig(attention_backend="cudnn")
    if importlib.util.find_spec("flashinfer") is None:
        with pytest.raises(ValueError, match="flashinfer package does not import"):
            resolve_backend("flashinfer", "cpu")
        # Refused before any weights load (the model name does not even exist).
        with pytest.raises(ValueError, match="flashinfer"):
            LLM("no-such-model", attention_backend="flashinfer", progress=False)
    import argparse
    p = argparse.ArgumentParser()
    add_engine_flags(p)
    assert engine_opts(p.parse_args([]))["attention_backend"] == "auto"
    assert engine_opts(p.parse_args(["--attention-backend", "triton"]))["attention_backend"] \
        == "triton"
    with pytest.raises(SystemExit):
        p.parse_args(["--attention-backend", "cudnn"])
    assert "--attention-backend {auto,torch,triton,cpu,flashinfer}" in p.format_help()
