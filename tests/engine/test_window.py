"""Window release: a long request holds only its window of SWA KV, and all of its full KV."""
import torch
from helpers.kv_checks import live_swa_pages
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams

PAGE, CHUNK, WINDOW = 16, 256, 512


def test_swa_occupancy_bounded_during_4000_token_request():
    model = tiny_gemma3_hf(seed=5, sliding_window=WINDOW, max_position_embeddings=8192)
    llm = LLM("tiny", loaded=loaded_from_hf(model), dtype="float32", kv_cache_memory="64MiB",
              page_size=PAGE, max_num_batched_tokens=CHUNK)
    eng, pool = llm.engine, llm.engine.pool
    ids = torch.randint(3, 512, (4000,), generator=torch.Generator().manual_seed(0)).tolist()
    peak = {"swa": 0, "steps": 0}
    release = pool.release_window

    def watched_release(seq_kv, seq_len):
        # Just before release is the high-water mark of a step: window + this chunk.
        peak["swa"] = max(peak["swa"], live_swa_pages(seq_kv) * PAGE)
        peak["steps"] += 1
        assert len(seq_kv.full_pages) * PAGE >= seq_len, "full pool lost tokens"
        freed = release(seq_kv, seq_len)
        live = live_swa_pages(seq_kv) * PAGE
        assert live <= WINDOW + PAGE, f"{live} SWA tokens held after release at {seq_len}"
        pool.check_integrity()
        return freed

    pool.release_window = watched_release
    seq = eng.add_request(ids, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    while eng.has_work():
        eng.step()
        if seq.kv is not None:
            assert len(seq.kv.full_pages) * PAGE >= seq.num_computed
            assert pool.full.allocator.num_in_use == len(seq.kv.full_pages)
    assert peak["steps"] >= 4000 // CHUNK + 39
    assert WINDOW < peak["swa"] <= WINDOW + CHUNK + PAGE
    assert len(seq.output_ids) == 40
    eng.check_integrity()


def test_full_kv_layout_keeps_every_layer():
    """The pre-SWA baseline layout: SWA layers stored like full ones, same tokens out."""
    model = tiny_gemma3_hf(seed=6, sliding_window=8)
    loaded = loaded_from_hf(model)
    ids = torch.randint(3, 512, (50,), generator=torch.Generator().manual_seed(1)).tolist()
    p = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = {}
    for layout in ("hybrid", "full-kv"):
        llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="8MiB", layout=layout,
                  page_size=4)
        outs[layout] = llm.generate({"prompt_token_ids": ids}, p)[0].token_ids
        assert llm.engine.pool.hybrid == (layout == "hybrid")
        llm.engine.check_integrity()
    assert outs["hybrid"] == outs["full-kv"]
