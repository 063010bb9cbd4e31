"""bench pd-bytes on a tiny hybrid model: the stream it counts is the full layers' pages and
the SWA window only, as plain arithmetic over the layout gives."""
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM
from mimo.bench.pd_bytes import measure
from mimo.disagg import wire


def test_pd_bytes_counts_full_pages_and_the_window():
    llm = LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf(seed=2, sliding_window=8)),
              dtype="float32", kv_cache_memory="4MiB", page_size=4, max_num_batched_tokens=64,
              progress=False)
    out = measure(llm, 203)
    lay = llm.engine.pool.layout
    per = {k: sum(x.elems for x in layers) * 4 for k, layers in (("full", lay.full),
                                                                  ("swa", lay.swa))}
    pages = -(-203 // 4)                    # 51
    window_pages = pages - (203 - 8) // 4   # 3: positions 195.. on whole pages
    assert out["kv_bytes"] == per["full"] * pages * 4 + per["swa"] * window_pages * 4
    assert out["full_kv_bytes"] == (per["full"] + per["swa"]) * 203
    assert 0 < out["wire_bytes"] - out["kv_bytes"] < 4096
    # framing: one frame per full layer per prefill chunk (the chunk's pages go as soon as it
    # ran), one per SWA layer (its window, after the last chunk); 12 bytes each, a 20-byte
    # trailer, and the JSON header
    chunk = llm.engine.config.scheduler.max_num_batched_tokens
    assert chunk % 4 == 0
    assert out["frames"] == len(lay.full) * -(-203 // chunk) + len(lay.swa)
    header = len(wire.header(lay, 203, 4, "float32", "bench"))
    assert out["wire_bytes"] - out["kv_bytes"] == header + 12 * out["frames"] + 20
    assert out["kv_bytes_ratio"] < 0.3      # 1 full of 6 layers, the rest a window of 8
