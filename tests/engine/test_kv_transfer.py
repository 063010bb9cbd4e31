"""Prompt KV exported by one engine and imported by another (disaggregated prefill/decode):
the decode engine's greedy tokens equal a single engine's, token for token, on tiny Gemma 3
and a tiny MiMo-V2-Flash with attention sinks, prefix cache on and off; only the full layers'
pages and the SWA window move; pools are whole and idle afterwards."""
import os

import pytest
import torch
from helpers.tiny_models import (
    loaded_from_hf,
    random_prompts,
    tiny_gemma3_hf,
    tiny_mimo_v2_flash_hf,
)

from mimo import LLM, SamplingParams
from mimo.engine.kv_export import KVExport
from mimo.engine.snapshot import engine_stats
from mimo.kvcache.kv_frames import PayloadCollector
from mimo.kvcache.kv_payload import KVPayload, full_kv_bytes, payload_shapes

SEEDS = [0, 1] if os.environ.get("CI") else [0, 1, 2, 3]


def _models():
    return {"gemma3": (tiny_gemma3_hf(seed=3, sliding_window=8), 512),
            "mimo_v2_flash": (tiny_mimo_v2_flash_hf(seed=4), 300)}


@pytest.fixture(scope="module")
def models():
    return {name: (loaded_from_hf(m), vocab) for name, (m, vocab) in _models().items()}


def _llm(loaded, prefix_cache, page_size=4, memory="2MiB"):
    return LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory=memory,
               page_size=page_size, max_num_batched_tokens=16, prefix_cache=prefix_cache,
               progress=False)


def _run(eng):
    while eng.has_work():
        eng.step()


def _prefill(eng, ids):
    """A prefill worker's half: greedy first token and the KV its frames carried (sent
    layer by layer, chunk by chunk, as the pages became final)."""
    seq = eng.new_sequence(ids, SamplingParams(temperature=0, max_tokens=1))
    pool = eng.pool
    got = PayloadCollector(KVPayload.empty(pool.layout, len(ids), pool.page_size,
                                           pool.full.k(0).dtype))
    seq.kv_export = KVExport(got)
    eng.enqueue(seq)
    _run(eng)
    assert got.complete and len(seq.output_ids) == 1
    return seq.output_ids[0], got.payload


def _decode(eng, ids, params, payload, first=None):
    seq = eng.new_sequence(ids, params)
    if first is not None:
        seq.append(first)
    eng.add_imported(seq, payload)
    _run(eng)
    return seq


@pytest.mark.parametrize("name", ["gemma3", "mimo_v2_flash"])
@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("seed", SEEDS)
def test_transferred_kv_gives_single_engine_tokens(models, name, prefix_cache, seed):
    loaded, vocab = models[name]
    single = _llm(loaded, prefix_cache)
    pre, dec = _llm(loaded, prefix_cache), _llm(loaded, prefix_cache)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    lengths = torch.randint(1, 60, (4,), generator=torch.Generator().manual_seed(seed)).tolist()
    prompts = random_prompts(seed, lengths + [lengths[0] + 5], vocab)
    prompts[-1][:lengths[0]] = prompts[0]       # a shared prefix: prefill cache hits
    for ids in prompts:
        ref = single.generate({"prompt_token_ids": ids}, params)[0].token_ids
        first, payload = _prefill(pre.engine, ids)
        assert first == ref[0]
        # First token given (plain greedy), and recomputed from the last prompt token.
        for given in (first, None):
            seq = _decode(dec.engine, ids, params, payload, given)
            assert seq.output_ids == ref, (ids, given)
        for eng in (pre.engine, dec.engine, single.engine):
            eng.check_integrity()
    assert dec.engine.transfers.imported == 2 * len(prompts)
    assert dec.engine.transfers.recomputed == 0


def test_payload_holds_full_pages_and_swa_window_only(models):
    loaded, vocab = models["gemma3"]
    pre = _llm(loaded, False)
    pool = pre.engine.pool
    ids = random_prompts(7, [45], vocab)[0]
    _, payload = _prefill(pre.engine, ids)
    P, W = pool.page_size, pool.window
    assert payload.tokens == 45 and payload.num_pages == 12
    assert payload.swa_first_page == (45 - W) // P
    first, full, swa = payload_shapes(pool.layout, 45, P)
    assert [tuple(k.shape) for k, _ in payload.full] == [k for k, _ in full]
    assert [tuple(k.shape) for k, _ in payload.swa] == [k for k, _ in swa]
    assert len(payload.full) == len(pool.layout.full) and len(payload.swa) == len(pool.layout.swa)
    # Against plain arithmetic: full layers every page, SWA layers (window + a page) rounded.
    elem = 4
    per_full = sum(lay.elems for lay in pool.layout.full) * elem
    per_swa = sum(lay.elems for lay in pool.layout.swa) * elem
    assert payload.nbytes == per_full * 12 * P + per_swa * (12 - first) * P
    assert payload.nbytes < full_kv_bytes(pool.layout, 45) * 0.5


def test_decode_engine_holds_only_the_window(models):
    loaded, vocab = models["gemma3"]
    pre, dec = _llm(loaded, False), _llm(loaded, False)
    ids = random_prompts(8, [57], vocab)[0]
    first, payload = _prefill(pre.engine, ids)
    eng = dec.engine
    seq = eng.new_sequence(ids, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    seq.append(first)
    eng.add_imported(seq, payload)
    eng.step()          # admitted and decoded one token
    live = sum(p is not None for p in seq.kv.swa_pages)
    assert live * eng.pool.page_size <= eng.pool.window + eng.pool.page_size
    assert len(seq.kv.full_pages) * eng.pool.page_size >= seq.num_computed
    _run(eng)
    eng.check_integrity()


def test_payload_that_does_not_fit_is_recomputed(models):
    """A payload paged for another pool is refused and the request recomputed locally: the
    same tokens, no error."""
    loaded, vocab = models["mimo_v2_flash"]
    single, pre = _llm(loaded, True), _llm(loaded, True, page_size=8)
    dec = _llm(loaded, True)
    ids = random_prompts(9, [30], vocab)[0]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ref = single.generate({"prompt_token_ids": ids}, params)[0].token_ids
    first, payload = _prefill(pre.engine, ids)
    seq = _decode(dec.engine, ids, params, payload, first)
    assert seq.output_ids == ref and seq.finish_reason == "length"
    assert dec.engine.transfers.recomputed == 1 and dec.engine.transfers.imported == 0
    st = engine_stats(dec.engine, 0)        # what a decode worker reports over HTTP
    assert (st.kv_imported, st.kv_import_recomputed) == (0, 1)
    seq = _decode(dec.engine, ids, params, _prefill(_llm(loaded, True).engine, ids)[1], None)
    assert seq.output_ids == ref
    st = engine_stats(dec.engine, 0)
    assert (st.kv_imported, st.kv_import_recomputed) == (1, 1)
    dec.engine.check_integrity()


def test_waiting_import_can_be_aborted(models):
    loaded, vocab = models["gemma3"]
    pre, dec = _llm(loaded, True), _llm(loaded, True)
    ids = random_prompts(10, [20], vocab)[0]
    first, payload = _prefill(pre.engine, ids)
    seq = dec.engine.new_sequence(ids, SamplingParams(temperature=0, max_tokens=4))
    seq.append(first)
    dec.engine.add_imported(seq, payload)
    assert dec.engine.has_work()
    dec.engine.abort(seq)
    assert not dec.engine.has_work() and seq.finish_reason == "abort"
    dec.engine.check_integrity()


def test_payload_too_big_for_an_empty_pool_is_recomputed(models):
    """An import that could never be placed, even with the engine otherwise idle (forced
    here: the admission checks say no), is recomputed instead of waiting forever."""
    loaded, vocab = models["gemma3"]
    pre = _llm(loaded, True)
    dec = _llm(loaded, True)
    ids = random_prompts(11, [40], vocab)[0]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ref = _llm(loaded, True).generate({"prompt_token_ids": ids}, params)[0].token_ids
    first, payload = _prefill(pre.engine, ids)
    tr = dec.engine.transfers
    tr._placeable = lambda payload: False       # type: ignore[method-assign]
    tr._fits = lambda seq, payload: False       # type: ignore[method-assign]
    seq = _decode(dec.engine, ids, params, payload, first)
    assert seq.output_ids == ref and tr.recomputed == 1 and tr.imported == 0
    dec.engine.check_integrity()
