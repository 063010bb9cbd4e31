"""A prefill worker's engine hands the prompt KV over frame by frame, each frame as soon as
its pages are final: a full layer's pages right after that layer ran in the chunk that
completed them, each SWA layer's window right after that layer ran in the prompt's last
chunk. The expected order is derived here from the model's config (which layers are full),
the chunk size and the page size alone, and checked against forward pre-hooks on the
model's layers (torch's, not the engine's): the first frame leaves in the first of the
prompt's steps, long before its last layer is computed. That the frames carry the right
KV is tests/engine/test_kv_transfer.py's (the decode engine's tokens equal one engine's)."""
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
from mimo.kvcache.kv_frames import PayloadCollector
from mimo.kvcache.kv_payload import KVPayload

P, CHUNK = 4, 16


class Trace:
    """The sink, and the log of layer starts and frames, tagged with the test's step count."""

    def __init__(self):
        self.step, self.events = 0, []

    def put(self, f) -> bool:
        self.events.append(("frame", self.step, f.layer, f.first_page, f.pages))
        return True


def _llm(hf, prefix_cache=False):
    return LLM("tiny", loaded=loaded_from_hf(hf), dtype="float32", kv_cache_memory="2MiB",
               page_size=P, max_num_batched_tokens=CHUNK, prefix_cache=prefix_cache,
               progress=False)


def _traced(eng, ids) -> Trace:
    t = Trace()
    hooks = [layer.register_forward_pre_hook(
        lambda mod, args, i=i: t.events.append(("layer", t.step, i)))
        for i, layer in enumerate(eng.model.layers)]
    seq = eng.new_sequence(ids, SamplingParams(temperature=0, max_tokens=1))
    seq.kv_export = KVExport(t)
    eng.enqueue(seq)
    try:
        while eng.has_work():
            t.step += 1
            eng.step()
    finally:
        for h in hooks:
            h.remove()
    assert len(seq.output_ids) == 1
    eng.check_integrity()
    return t


def _expected(types, n, window, start=0):
    """The events of a prompt of n tokens computed from `start` in chunks of CHUNK: layer
    starts and, right after each layer, its frame of the pages that chunk completed."""
    full = [i for i, t in enumerate(types) if t == "full"]
    swa = [i for i, t in enumerate(types) if t != "full"]
    pages = -(-n // P)
    out, sent, step = [], 0, 0
    for end in range(start + CHUNK, n + CHUNK, CHUNK):
        step += 1
        last = end >= n
        hi = pages if last else end // P
        for i in range(len(types)):
            out.append(("layer", step, i))
            if i in full and hi > sent:
                out.append(("frame", step, full.index(i), sent, hi - sent))
            if i in swa and last:
                first = max(0, n - window) // P
                out.append(("frame", step, len(full) + swa.index(i), 0, pages - first))
        sent = hi
    return out


MODELS = {"gemma3": lambda: tiny_gemma3_hf(seed=3, sliding_window=8),
          "mimo_v2_flash": lambda: tiny_mimo_v2_flash_hf(seed=4)}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("n", [45, 6, 16, 33])
def test_frames_leave_layer_by_layer_chunk_by_chunk(name, n):
    hf = MODELS[name]()
    llm = _llm(hf)
    eng = llm.engine
    types = hf.config.layer_types
    types = ["full" if t == "full_attention" else "swa" for t in types]
    t = _traced(eng, random_prompts(n, [n], 250)[0])
    assert t.step == -(-n // CHUNK)                 # the steps the prompt takes
    assert t.events == _expected(types, n, eng.pool.window)
    if n > CHUNK:       # the first frame left in the first step, before the last chunk ran
        assert next(e for e in t.events if e[0] == "frame")[1] == 1 < t.step


def test_cached_pages_leave_with_the_first_chunk():
    """Pages the prefix cache held are final at once: they go with the first layer call."""
    hf = MODELS["mimo_v2_flash"]()
    eng = _llm(hf, prefix_cache=True).engine
    a = random_prompts(1, [45], 250)[0]
    _traced(eng, a)
    b = a[:40] + random_prompts(2, [13], 250)[0]      # 53 tokens, 40 shared
    t = _traced(eng, b)
    frames = [e for e in t.events if e[0] == "frame"]
    full_layers = sum(1 for x in hf.config.layer_types if x == "full_attention")
    # every full layer's first frame is in step 1 and starts at page 0
    firsts = {e[2]: e for e in reversed(frames) if e[2] < full_layers}
    assert sorted(firsts) == list(range(full_layers))
    assert all(e[1] == 1 and e[3] == 0 for e in firsts.values())
    # fewer steps than the whole prompt would take: the hit was used
    assert t.step < -(-53 // CHUNK)
    for j in range(full_layers):
        assert sum(e[4] for e in frames if e[2] == j) == -(-53 // P)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_frames_are_pinned_copies_that_give_one_engines_tokens():
    """On a CUDA pool each frame is a pinned host copy with the event its asynchronous copy
    completes at; assembled (waiting on the events) and imported into another CUDA engine,
    the greedy tokens equal a single CUDA engine's."""
    hf = MODELS["mimo_v2_flash"]()
    loaded = loaded_from_hf(hf)

    def llm():
        return LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="2MiB",
                   page_size=P, max_num_batched_tokens=CHUNK, progress=False, device="cuda")
    eng = llm().engine
    frames = []

    class Keep:
        def put(self, f):
            frames.append(f)
            return True
    ids = random_prompts(3, [45], 250)[0]
    seq = eng.new_sequence(ids, SamplingParams(temperature=0, max_tokens=1))
    seq.kv_export = KVExport(Keep())
    eng.enqueue(seq)
    while eng.has_work():
        eng.step()
    eng.check_integrity()
    assert frames and all(f.k.device.type == "cpu" and f.k.is_pinned() and f.v.is_pinned()
                          and isinstance(f.ready, torch.cuda.Event) for f in frames)
    pool = eng.pool
    got = PayloadCollector(KVPayload.empty(pool.layout, 45, P, torch.float32))
    for f in frames:
        got.put(f)          # waits on each frame's event
    assert got.complete
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref = llm().generate({"prompt_token_ids": ids}, params)[0].token_ids
    dec = llm().engine
    d = dec.new_sequence(ids, params)
    d.append(seq.output_ids[0])
    dec.add_imported(d, got.payload)
    while dec.has_work():
        dec.step()
    assert d.output_ids == ref
    dec.check_integrity()
