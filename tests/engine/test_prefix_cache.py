"""The prefix cache inside the engine: cached prompt tokens skip prefill, and greedy output is
the same with the cache on and off. Expected reuse is computed independently of the tree's
own match: a brute-force walk over its nodes finds the longest prefix with full KV on every
page and live SWA on the window before it."""
import random

import pytest
import torch
from helpers.kv_checks import drop_speculative_windows
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.engine.decode_step import PlainDecode
from mimo.engine.parts import EngineParts
from mimo.engine.prefill_planner import ChunkedPrefill

PAGE, WINDOW = 8, 32
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=7, sliding_window=WINDOW,
                                         max_position_embeddings=8192))


def make(loaded, cache=True, **kw):
    opts = dict(dtype="float32", kv_cache_memory="16MiB", page_size=PAGE,
                max_num_batched_tokens=256, prefix_cache=cache, progress=False)
    opts.update(kw)
    return LLM("tiny", loaded=loaded, **opts)


class LogitRecorder(PlainDecode):
    """Plain greedy decoding that keeps the logits of every sampled row: a stricter check
    than equal tokens (a slightly wrong KV rarely flips a tiny model's argmax)."""

    def __init__(self):
        self.rows: list[torch.Tensor] = []

    def execute(self, runner, head, chunks):
        hidden = runner.execute(chunks)
        self.rows.extend(head.logits(hidden))
        from mimo.gpu.sampling import sample
        sampled = [c for c in chunks if c.sample]
        return [[t] for t in sample(head, hidden, [c.seq.params for c in sampled],
                                    [c.seq.generator for c in sampled])]

    def take(self) -> torch.Tensor:
        out, self.rows = torch.stack(self.rows), []
        return out


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 512, (n,), generator=g).tolist()


def run(llm, prompts, params=GREEDY):
    """Generate prompts one after another; integrity checked after each."""
    outs = []
    for p in prompts:
        outs.append(llm.generate({"prompt_token_ids": p}, params)[0])
        llm.engine.check_integrity()
    return outs


def brute_force_safe_len(tree, tokens, rebuild: int = 0) -> int:
    """Longest page-aligned L <= len(tokens) whose pages all have cached full KV along the
    path of `tokens` and whose window (positions [L - W + 1, L)) has live SWA. `rebuild`
    (tokens): a request may instead start about `rebuild` tokens before the end E of the
    cached full KV and recompute the SWA window there: max of the two."""
    P, W = tree.P, tree.W
    full_ok, swa_ok = [], []
    node = tree.paths.roots.get(None)
    pos = 0
    while node is not None:
        child = node.children.get(tuple(tokens[pos:pos + P]))
        if child is None:
            break
        for i in range(len(child.full)):
            if list(child.tokens[i * P:(i + 1) * P]) != list(tokens[pos:pos + P]):
                node = None
                break
            full_ok.append(True)
            swa_ok.append(child.swa[i] >= 0)
            pos += P
        else:
            node = child
    best = 0
    for q in range(1, min(len(full_ok), len(tokens) // P) + 1):
        L = q * P
        first = max(L - W + 1, 0) // P
        if all(swa_ok[first:q]):
            best = L
    if rebuild:
        # Start early enough that SWA is exact (from start + rebuild - (W - 1)) on every
        # page of E's window, whose first page starts at (E - W + 1) // P * P.
        E = min(len(full_ok), len(tokens) // P) * P
        first = (E - W + 1) // P * P
        best = max(best, (first - (rebuild - (W - 1))) // P * P)
    return best


# The tiny Gemma 3 recomputes (window - 1) tokens per SWA layer (5 of its 6) in a rebuild.
RECEPTIVE = 5 * (WINDOW - 1)


def test_repeated_prompt_is_served_from_cache(loaded):
    p = ids(203, 1)
    ref, rec = LogitRecorder(), LogitRecorder()
    off = run(make(loaded, cache=False, parts=EngineParts(decode=ref)), [p])
    on = make(loaded, parts=EngineParts(decode=rec))
    first, second = run(on, [p, p])
    assert first.cached_tokens == 0
    # All but the last prompt token: 200 from whole pages, 200..201 copied from the first
    # rows of the cached page that goes on with the first answer (radix/tails.py).
    assert second.cached_tokens == len(p) - 1
    assert on.engine.cache.counters()["partial_tokens"] == 2
    assert first.token_ids == second.token_ids == off[0].token_ids
    want = ref.take()
    torch.testing.assert_close(rec.take(), torch.cat([want, want]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_a_repeated_prompt_reuses_the_partial_page_its_first_run_left(loaded, max_tokens):
    """The first run's KV ends inside a page (203 prompt tokens, then max_tokens - 1 fed
    back outputs): that partial page is kept as its path's tail, and the repeat copies its
    rows, every prompt token but the last one cached; logits equal the uncached ones."""
    p = ids(203, 1)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ref, rec = LogitRecorder(), LogitRecorder()
    run(make(loaded, cache=False, parts=EngineParts(decode=ref)), [p], params)
    on = make(loaded, parts=EngineParts(decode=rec))
    first, second = run(on, [p, p], params)
    assert (first.cached_tokens, second.cached_tokens) == (0, len(p) - 1)
    assert on.engine.cache.counters()["partial_tokens"] == (len(p) - 1) % PAGE
    want = ref.take()
    torch.testing.assert_close(rec.take(), torch.cat([want, want]), rtol=1e-4, atol=1e-4)
    # Another prompt forking inside that page copies only the rows it agrees on.
    fork = p[:201] + ids(9, 2)
    assert run(on, [fork], params)[0].cached_tokens == 201


@pytest.mark.parametrize("rebuild", [False, True], ids=["cut-back", "window-rebuild"])
def test_prompts_sharing_a_1500_token_prefix(loaded, rebuild):
    prefix = ids(1500, 2)
    a, b, c = (prefix + ids(40 + 7 * i, 10 + i) for i in range(3))
    ref, rec = LogitRecorder(), LogitRecorder()
    off = make(loaded, cache=False, parts=EngineParts(decode=ref))
    want = [run(off, [p])[0] for p in (a, b)]
    want_b_logits = ref.take()[-GREEDY.max_tokens:]
    want += run(off, [c])
    llm = make(loaded, window_rebuild=rebuild, parts=EngineParts(decode=rec))
    tree = llm.engine.cache.tree
    out_a = run(llm, [a])[0]
    # a's chunks left a window before every page (speculative, retention's `spare`); SWA
    # pressure takes those first (a's own end window stays).
    drop_speculative_windows(llm)
    # b forks off a's path at 1500, where a kept no window: cut back to a's last window,
    # or (rebuild) to RECEPTIVE tokens before 1496.
    expect_b = brute_force_safe_len(tree, b[:-1], RECEPTIVE * rebuild)
    if rebuild:
        assert expect_b > brute_force_safe_len(tree, b[:-1])
    rec.take()
    out_b = run(llm, [b])[0]
    # Every logit of b, not only its tokens: the KV b computed after its match is exact.
    torch.testing.assert_close(rec.take(), want_b_logits, rtol=1e-4, atol=1e-4)
    # b branched at 1500 and kept that window: c reuses the whole shared prefix.
    expect_c = brute_force_safe_len(tree, c[:-1])
    out_c = run(llm, [c])[0]
    assert out_a.cached_tokens == 0
    # (cut back: to nothing, a's only firm window is its end's; the cut back to an evicted
    # window's predecessor: test_match_is_cut_back_when_interior_swa_was_evicted)
    assert out_b.cached_tokens == expect_b and (expect_b > 0 or not rebuild)
    # whole pages to 1496, then the rows of b's page it agrees on (b's chunk left its SWA)
    assert expect_c == 1500 // PAGE * PAGE and out_c.cached_tokens == 1500
    assert [o.token_ids for o in (out_a, out_b, out_c)] == [w.token_ids for w in want]


def test_a_fork_inside_a_long_chunk_reuses_the_whole_shared_prefix(loaded):
    """A prompt prefilled in chunks of 256 (8 windows of 32) leaves the SWA of every chunk's
    pages in the tree, speculative, not only the windows before its chunks' ends: prompts
    forking at 1,500 and at 1,001 (inside chunks) reuse every whole page they share, their
    logits the uncached ones. (An SWA pool with room for them: under pressure they are the
    first to go.)"""
    prefix = ids(1500, 2)
    a = prefix + ids(40, 10)
    forks = [prefix + ids(47, 11), prefix[:1001] + ids(30, 12)]
    for f in forks:
        ref, rec = LogitRecorder(), LogitRecorder()
        want = run(make(loaded, cache=False, parts=EngineParts(decode=ref)), [f])[0]
        llm = make(loaded, kv_cache_memory="32MiB", swa_share=0.5,
                   parts=EngineParts(decode=rec))
        assert run(llm, [a])[0].cached_tokens == 0
        assert llm.engine.cache.tree.counters["tombstoned_swa"] == 0
        rec.take()
        shared = next(i for i, (x, y) in enumerate(zip(f, a)) if x != y)
        assert brute_force_safe_len(llm.engine.cache.tree, f[:-1]) == shared // PAGE * PAGE
        out = run(llm, [f])[0]
        # whole pages, then the rows of a's next page it agrees on (radix/tails.py)
        assert out.cached_tokens == shared
        torch.testing.assert_close(rec.take(), ref.take(), rtol=1e-4, atol=1e-4)
        assert out.token_ids == want.token_ids


@pytest.mark.parametrize("rebuild", [False, True], ids=["cut-back", "window-rebuild"])
def test_match_is_cut_back_when_interior_swa_was_evicted(loaded, rebuild):
    prefix = ids(1200, 3)
    a = prefix + ids(30, 4)
    b = prefix[:1100] + ids(50, 5)
    fillers = [ids(300, 100 + i) for i in range(3)]
    ref, rec = LogitRecorder(), LogitRecorder()
    want = run(make(loaded, cache=False, parts=EngineParts(decode=ref)), [a, *fillers, b])
    want_b_logits = ref.take()[-GREEDY.max_tokens:]
    # A small SWA pool: the fillers' windows push a's retained SWA out while its full KV
    # (a roomy full pool) stays. (Not too many fillers: the windows a running filler's own
    # chunks leave keep their time while it runs, so a long enough run of them would drop
    # a's leaf, the oldest, and with it a's full KV.)
    llm = make(loaded, kv_cache_memory="6MiB", swa_share=0.07, max_num_batched_tokens=64,
               window_rebuild=rebuild, parts=EngineParts(decode=rec))
    tree = llm.engine.cache.tree
    outs = run(llm, [a, *fillers])
    assert tree.counters["tombstoned_swa"] > 0
    safe = brute_force_safe_len(tree, b[:-1])
    expect = brute_force_safe_len(tree, b[:-1], RECEPTIVE * rebuild)
    m_prefix = tree.match(b[:-1], count=False).prefix_len
    assert m_prefix >= 1096 > safe + RECEPTIVE, "the test needs b's shared prefix cut back"
    rec.take()
    out_b = run(llm, [b])[0]
    assert out_b.cached_tokens == expect
    torch.testing.assert_close(rec.take(), want_b_logits, rtol=1e-4, atol=1e-4)
    if rebuild:     # it recomputed only the receptive field before the fork
        assert m_prefix - RECEPTIVE - 2 * PAGE <= expect <= m_prefix - RECEPTIVE
    assert [o.token_ids for o in outs + [out_b]] == [w.token_ids for w in want]


def test_a_cached_prompt_whose_window_went_is_rebuilt_not_dropped(loaded):
    """With window rebuild, SWA pressure frees even a cached prompt's tail window while its
    full KV stays (a leaf longer than the receptive field is not protected); the same prompt
    again then reuses all but a receptive field of it, and its logits are the uncached
    ones."""
    p = ids(600, 6)
    ref, rec = LogitRecorder(), LogitRecorder()
    run(make(loaded, cache=False, parts=EngineParts(decode=ref)), [p])
    want = ref.take()
    llm = make(loaded, parts=EngineParts(decode=rec))
    eng, tree = llm.engine, llm.engine.cache.tree
    assert run(llm, [p])[0].cached_tokens == 0
    rec.take()
    full = tree.stats()["full_pages"]
    live = tree.stats()["swa_live_pages"] + tree.stats()["tails"]   # (a tail holds one)
    eng.cache.make_room(0, eng.pool.swa.allocator.num_free + live)
    eng.check_integrity()
    assert tree.stats()["swa_live_pages"] == 0 and tree.stats()["full_pages"] == full
    expect = brute_force_safe_len(tree, p[:-1], RECEPTIVE)
    assert brute_force_safe_len(tree, p[:-1]) == 0 < expect
    out = run(llm, [p])[0]
    assert out.cached_tokens == expect
    torch.testing.assert_close(rec.take(), want, rtol=1e-4, atol=1e-4)


def test_multi_turn_chat_reuses_prompt_and_output(loaded):
    turns = [ids(90, 20), ids(25, 21), ids(33, 22)]
    on, off = make(loaded), make(loaded, cache=False)
    history_on, history_off, prev_len = [], [], 0
    for k, user in enumerate(turns):
        history_on, history_off = history_on + user, history_off + user
        o_on = run(on, [history_on])[0]
        o_off = run(off, [history_off])[0]
        assert o_on.token_ids == o_off.token_ids
        if k:
            # Everything of the previous turn with KV: its prompt and all but its last
            # output token (never fed back), its partial last page copied.
            assert o_on.cached_tokens == prev_len - 1
        prev_len = len(history_on) + len(o_on.token_ids)
        history_on = history_on + o_on.token_ids
        history_off = history_off + o_off.token_ids


def test_concurrent_request_reuses_a_prefill_in_flight(loaded):
    prefix = ids(600, 6)
    a, b = prefix + ids(20, 7), prefix + ids(20, 8)
    llm = make(loaded, max_num_batched_tokens=128)
    eng = llm.engine
    sa = eng.add_request(a, GREEDY)
    for _ in range(3):                      # a has prefilled 384 tokens, not finished
        eng.step()
    assert sa.finish_reason is None and sa.num_computed == 384
    sb = eng.add_request(b, GREEDY)
    while eng.has_work():
        eng.step()
        eng.check_integrity()
    assert sb.cached_tokens >= 384 - WINDOW
    want = run(make(loaded, cache=False), [a, b])
    assert [sa.output_ids, sb.output_ids] == [w.token_ids for w in want]


def test_full_kv_layout_caches_every_prefix(loaded):
    prefix = ids(500, 9)
    a, b = prefix + ids(30, 11), prefix + ids(30, 12)
    llm = make(loaded, layout="full-kv")
    out = run(llm, [a, b])
    # The shared 500 tokens: 62 whole pages and the first 4 rows of a's next page (copied).
    assert out[1].cached_tokens == 500
    want = run(make(loaded, cache=False), [a, b])
    assert [o.token_ids for o in out] == [w.token_ids for w in want]


def test_full_pools_evict_the_cache_instead_of_waiting(loaded):
    llm = make(loaded, kv_cache_memory="3MiB")
    eng = llm.engine
    n = eng.pool.full.allocator.capacity * PAGE // 400 + 3     # more than the full pool holds
    run(llm, [ids(400, 200 + i) for i in range(n)])
    # (The small SWA pool fills first: windows go alone, then whole cached prompts.)
    assert eng.cache.tree.counters["tombstoned_swa"] > 0
    assert eng.cache.tree.counters["evicted_full"] > 0
    fa = eng.pool.full.allocator
    assert fa.num_evictable > 0 and fa.num_in_use == 0


@pytest.mark.parametrize("trial", range(6))
def test_random_concurrent_traffic_matches_cache_off(loaded, trial):
    """Batches of requests with random shared prefixes, random chunking and pool sizes:
    tree and pool integrity after every step, outputs equal to the cache off."""
    rnd = random.Random(trial)
    base = ids(160, 1000 + trial)
    prompts = [base[:rnd.randint(0, 160)] + ids(rnd.randint(1, 90), 2000 + 50 * trial + k)
               for k in range(10)]
    params = [SamplingParams(temperature=0, max_tokens=rnd.choice([3, 17, 30]),
                             ignore_eos=True) for _ in prompts]
    kw = dict(kv_cache_memory="2MiB", swa_share=rnd.choice([0.2, 0.35, 0.5]),
              max_num_batched_tokens=rnd.choice([16, 64]),
              policy=rnd.choice(["fcfs", "compute-aware"]))
    want = make(loaded, cache=False, **kw).generate(
        [{"prompt_token_ids": p} for p in prompts], params)
    llm = make(loaded, **kw)
    eng = llm.engine
    for _ in range(2):                      # the second round meets a warm cache
        seqs = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
        while eng.has_work():
            eng.step()
            eng.check_integrity()
        assert [s.output_ids for s in seqs] == [w.token_ids for w in want]
    assert eng.cache.tree.counters["matched_tokens"] > 0


def test_a_rebuild_aborted_midway_leaves_no_inexact_swa_in_the_cache(loaded):
    """Stopped inside its rebuild, a request's SWA KV is still inexact in the upper layers:
    none of it may become a cached window (where the request stopped is a checkpoint the
    tree would like). The same prompt afterwards gives exactly the uncached logits."""
    prefix = ids(1500, 2)
    a, b = prefix + ids(40, 10), prefix + ids(47, 11)
    ref, rec = LogitRecorder(), LogitRecorder()
    off = make(loaded, cache=False, parts=EngineParts(decode=ref))
    run(off, [b])
    want = ref.take()
    class SmallChunks(ChunkedPrefill):     # b's prefill in 32-token steps
        small = False

        def plan(self, seq, remaining, budget, room):
            return min(super().plan(seq, remaining, budget, room), 32 if self.small else budget)

    chunks = SmallChunks()
    llm = make(loaded, parts=EngineParts(decode=rec, prefill=chunks))
    eng = llm.engine
    run(llm, [a])
    drop_speculative_windows(llm)       # b's fork at 1500 has no window: it rebuilds
    chunks.small = True
    seq = eng.add_request(b, GREEDY)
    while seq.num_computed == 0:
        eng.step()
    start = seq.kv.swa_floor        # the rebuild's first position (its cached tokens)
    eng.step()      # one more chunk: still short of where its SWA becomes exact
    assert 0 < start < seq.num_computed < seq.kv.swa_exact_from
    assert seq.kv.full_cached_to == 1496
    eng.abort(seq)
    eng.check_integrity()
    rec.take()
    out = run(llm, [b])[0]
    assert out.cached_tokens == start
    torch.testing.assert_close(rec.take(), want, rtol=1e-4, atol=1e-4)
