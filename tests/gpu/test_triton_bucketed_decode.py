"""The graph-ready decode step (decode_graphs=on): steps of plain decodes padded to a fixed
batch size, from static buffers and static paged metadata. On CPU the padded step runs
eagerly through the Triton backend (interpreted); its greedy tokens must be the torch
backend's plain step's, on a tiny Gemma 3 and a tiny MiMo-V2-Flash, with 7 requests that
finish at different steps, so the decode batch shrinks 7, 5, 3, 1 (run at sizes 8, 8, 4, 1:
padding rows present), the prefix cache on.
"""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf, tiny_mimo_v2_flash_hf

from mimo import LLM, SamplingParams
from mimo.config import ConfigError
from mimo.engine.graph_decode import resolve_decode_graphs
from mimo.gpu.decode_buckets import StaticDecodeMeta, bucket_for, decode_buckets
from mimo.gpu.paged_metadata import PagedAttnMeta

OPTS = dict(dtype="float32", kv_cache_memory="64MiB", page_size=4, max_num_batched_tokens=96,
            max_num_seqs=8, progress=False)
WAVES = (7,)          # requests started together; each finishes after its own count


def _generate(loaded, backend: str, graphs: str, vocab: int, device: str):
    llm = LLM("tiny", loaded=loaded, attention_backend=backend, decode_graphs=graphs,
              device=device, **OPTS)
    eng = llm.engine
    g = torch.Generator().manual_seed(7)
    outs = []
    for size in WAVES:
        seqs = []
        for i in range(size):
            n = int(torch.randint(3, 19, (1,), generator=g))
            prompt = torch.randint(3, vocab, (n,), generator=g).tolist()
            params = SamplingParams(temperature=0, max_tokens=2 + i % 4, ignore_eos=True)
            seqs.append(eng.add_request(prompt, params))
        while eng.has_work():
            eng.step()
            eng.check_integrity()
        outs += [s.output_ids for s in seqs]
    return outs, eng


def _check(loaded, vocab, device):
    """On CPU the padded step runs eagerly; on CUDA (TRITON_INTERPRET=0 on a GPU machine)
    each size is captured as a CUDA graph on first use and replayed after."""
    want, plain = _generate(loaded, "torch", "off", vocab, device)
    assert plain.runner.bucketed is None
    got, eng = _generate(loaded, "triton", "on", vocab, device)
    assert eng.runner.bucketed.capture == (device == "cuda")
    assert got == want
    steps = eng.runner.bucketed.steps
    padded = {k for k in steps if k[0] < k[1]}
    # Sizes 1, 2, 4, 8: 7 and 5 decodes run at 8, 3 at 4 (padding rows), the last one at 1.
    assert {(7, 8), (5, 8), (3, 4)} <= padded and (1, 1) in steps, steps


def test_triton_bucketed_gemma3_matches_plain_step(triton_device):
    _check(loaded_from_hf(tiny_gemma3_hf()), 512, triton_device)


def test_triton_bucketed_mimo_matches_plain_step(triton_device):
    if triton_device == "cuda":
        pytest.skip("MiMo-V2-Flash's MoE routes on the host: decode_graphs=on is refused on "
                    "CUDA (test_resolve_decode_graphs); its padded step is checked on CPU")
    _check(loaded_from_hf(tiny_mimo_v2_flash_hf()), 300, triton_device)


def test_padded_rows_equal_the_plain_step_rows(triton_device):
    """Step by step, the padded step's hidden states of the real rows against the ordinary
    path (the runner's own metadata, no padding) over the same chunks, through the same
    kernels: float32, within 1e-5 (only the split count and batch shape differ)."""
    llm = LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf()), attention_backend="triton",
              decode_graphs="on", device=triton_device, **OPTS)
    eng = llm.engine
    b, runner = eng.runner.bucketed, eng.runner
    compared = []

    def run(chunks):
        got = type(b).run(b, chunks)
        if got is not None:
            *args, kw = runner.prepare(chunks)
            want = runner.model(*args, **kw)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            compared.append(len(chunks))
        return got
    b.run = run
    for i, n in enumerate((5, 11, 17)):
        eng.add_request(list(range(3, 3 + n)), SamplingParams(temperature=0, max_tokens=4 + i,
                                                              ignore_eos=True))
    while eng.has_work():
        eng.step()
    assert 3 in compared and 1 in compared, compared


def test_decode_buckets():
    assert decode_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert decode_buckets(8) == (1, 2, 4, 8)
    assert decode_buckets(6) == (1, 2, 4, 6)
    assert decode_buckets(1) == (1,)
    assert decode_buckets(20) == (1, 2, 4, 8, 16, 20)
    b = decode_buckets(20)
    assert [bucket_for(n, b) for n in (1, 2, 3, 5, 9, 17, 20, 21)] == [1, 2, 4, 8, 16, 20, 20, None]
    with pytest.raises(ValueError):
        decode_buckets(0)


def _meta(q_start, page_lists, page_size=4, write_slots=None):
    """Host metadata of one-query entries at positions `q_start`, keys from position 0."""
    n = len(q_start)
    kvp = [0]
    for pl in page_lists:
        kvp.append(kvp[-1] + len(pl))

    def t(x):
        return torch.tensor(x, dtype=torch.int32)
    return PagedAttnMeta(
        kind="full", page_size=page_size, window_left=-1, has_sinks=False,
        qo_indptr=t(list(range(n + 1))), kv_indptr=t(kvp),
        kv_indices=t([p for pl in page_lists for p in pl]),
        kv_last_page_len=t([q % page_size + 1 for q in q_start]), kv_start_pos=t([0] * n),
        q_start_pos=t(q_start), key_floor=t([0] * n), entry_chunk=t(list(range(n))),
        positions=t(q_start), write_rows=t(list(range(n))),
        write_slots=t(write_slots or [pl[-1] * page_size + q % page_size
                                      for pl, q in zip(page_lists, q_start)]),
        all_decode=True, needs_floor_mask=False)


def test_padding_rows_repeat_row_zero_and_see_one_key():
    s = StaticDecodeMeta("full", 4, -1, False, max_rows=8, max_pages=4, device="cpu")
    m = _meta([9, 2, 13], [[5, 1, 7], [3], [2, 4, 6, 0]])
    assert s.fill(m, 8)
    v = s.view(8)
    assert v.num_entries == 8 and v.max_kv_len == 16
    # Real rows unchanged, then five padding rows.
    assert v.kv_indptr.tolist() == [0, 3, 4, 8, 9, 10, 11, 12, 13]
    assert v.kv_indices[:13].tolist() == [5, 1, 7, 3, 2, 4, 6, 0] + [7] * 5
    assert v.q_start_pos.tolist() == [9, 2, 13] + [9] * 5
    assert v.write_rows.tolist() == [0, 1, 2] + [0] * 5
    assert v.write_slots.tolist() == [29, 14, 1] + [29] * 5
    # Every entry satisfies kv_len = q_start + 1 - kv_start; a padding one sees only key 9
    # (the floor), in page 7 at offset 1: the slot row 0 writes.
    assert torch.equal(v.kv_len, v.q_start_pos + 1 - v.kv_start_pos)
    for e in range(3, 8):
        assert int(v.key_floor[e]) == 9 and int(v.kv_start_pos[e]) == 8
        assert int(v.kv_len[e]) == 2
    # The same view object (fixed tensors) every time; a smaller step refills it.
    assert s.view(8) is v
    assert s.fill(_meta([3], [[1]]), 8) and v.q_start_pos.tolist() == [3] * 8


def test_fill_refuses_what_does_not_fit():
    s = StaticDecodeMeta("full", 4, -1, False, max_rows=4, max_pages=2, device="cpu")
    assert not s.fill(_meta([9], [[5, 1, 7]]), 4)                 # 3 pages > 2
    assert not s.fill(_meta([1, 2, 3, 1, 2], [[1]] * 5), 8)        # more rows than buffers
    m = _meta([1, 2], [[1], [2]])
    skipped = PagedAttnMeta(**{**m.__dict__, "write_rows": m.write_rows[:1],
                               "write_slots": m.write_slots[:1]})
    assert not s.fill(skipped, 2)                                  # a row not written


class _Syncing(torch.nn.Module):
    syncs_host = True


def test_resolve_decode_graphs():
    plain, moe = torch.nn.Linear(2, 2), torch.nn.Sequential(_Syncing())
    assert resolve_decode_graphs("auto", "cpu", True, plain) == (False, False)
    assert resolve_decode_graphs("auto", "cuda", True, plain) == (True, True)
    assert resolve_decode_graphs("auto", "cuda", False, plain) == (False, False)
    assert resolve_decode_graphs("auto", "cuda", True, moe) == (False, False)
    assert resolve_decode_graphs("on", "cpu", True, moe) == (True, False)
    assert resolve_decode_graphs("on", "cuda", True, plain) == (True, True)
    assert resolve_decode_graphs("off", "cuda", True, plain) == (False, False)
    with pytest.raises(ConfigError, match="paged attention backend"):
        resolve_decode_graphs("on", "cpu", False, plain)
    with pytest.raises(ConfigError, match="cannot be captured"):
        resolve_decode_graphs("on", "cuda", True, moe)
    with pytest.raises(ConfigError, match="auto, on or off"):
        resolve_decode_graphs("always", "cpu", True, plain)


def test_on_with_torch_backend_refused():
    with pytest.raises(ConfigError, match="paged attention backend"):
        LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf()), attention_backend="torch",
            decode_graphs="on", **OPTS)
    with pytest.raises(ConfigError, match="decode_graphs"):
        LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf()), decode_graphs="yes", **OPTS)
