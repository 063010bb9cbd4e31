"""The MTP drafter on a tiny random MiMo-V2-Flash with 2 MTP layers (window 6 + the query,
page 4, chunked prefill): its MTP KV is written from the first prompt token on and equals a
plain whole-sequence forward of the MTP layers; greedy output with it on equals output with
speculation off, token for token, under batching, rollbacks and prefix-cache hits, with the
pools intact after every step; drafts are clamped to the MTP layer count."""
import dataclasses
import random

import pytest
import torch
from helpers.kv_checks import drop_speculative_windows
from helpers.mtp_reference import mtp_weights, plain_mtp
from helpers.tiny_models import tiny_mimo_v2_flash_hf

from mimo import LLM, SamplingParams
from mimo.config import ConfigError, SpecConfig
from mimo.models.hf_config import model_config_from_hf
from mimo.models.registry import LoadedModel
from mimo.spec import MTPDrafter, make_drafter

K = 2
OPTS = dict(dtype="float32", kv_cache_memory="4MiB", page_size=4, max_num_batched_tokens=12,
            progress=False)


@pytest.fixture(scope="module")
def hf_model():
    return tiny_mimo_v2_flash_hf()


def _loaded(hf, two_token_head=False) -> LoadedModel:
    w = {k: v.detach().clone() for k, v in hf.state_dict().items()} | mtp_weights(hf, K)
    if two_token_head:
        # Every logit 0 but two opposite ones: target and MTP layers (sharing the head) both
        # answer 7 or 9, so drafts are often accepted and multi-token steps are exercised.
        v = w["lm_head.weight"][7].clone()
        w["lm_head.weight"] = torch.zeros_like(w["lm_head.weight"])
        w["lm_head.weight"][7], w["lm_head.weight"][9] = v, -v
    cfg = dataclasses.replace(model_config_from_hf(hf.config.to_dict()), num_mtp_layers=K)
    return LoadedModel(cfg, w, None, "tiny")


def _prompts(n, seed):
    rng = random.Random(seed)
    shared = [rng.randrange(3, 300) for _ in range(9)]
    out = []
    for i in range(n):
        own = [rng.randrange(3, 300) for _ in range(rng.randint(1, 30))]
        out.append(shared + own if i % 2 else own)
    return out


def _step_all(llm, prompts, params):
    """Run to completion one step at a time, checking the pools after every step."""
    eng = llm.engine
    seqs = [eng.add_request(p, q) for p, q in zip(prompts, params)]
    while eng.has_work():
        eng.step()
        eng.check_integrity()
    return seqs


@pytest.mark.parametrize("two_token_head", [False, True])
def test_greedy_output_equals_plain_decoding(hf_model, two_token_head):
    loaded = _loaded(hf_model, two_token_head)
    off = LLM("tiny", loaded=loaded, **OPTS)
    on = LLM("tiny", loaded=loaded, speculative="mtp", num_draft_tokens=K, **OPTS)
    prompts = _prompts(7, 1)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
              for m in (1, 2, 5, 9, 17, 25, 40)]
    for round_ in range(2):              # the second round is served from the prefix cache
        want = _step_all(off, prompts, params)
        got = _step_all(on, prompts, params)
        for w, g in zip(want, got):
            assert g.output_ids == w.output_ids
        if round_:
            # Prompts longer than a page or two hit (shorter ones have nothing window-safe).
            hits = [g.cached_tokens > 0 for g in got]
            assert sum(hits) >= 4, [(len(p), g.cached_tokens) for p, g in zip(prompts, got)]
    t = on.engine.spec.totals
    assert sum(t.drafted) > 50
    if two_token_head:
        # Multi-token steps really happen: drafts accepted at both positions, several times
        # (the drafts themselves are checked against a plain forward in the KV test).
        assert t.accepted[0] >= 10 and t.accepted[1] >= 3, (t.drafted, t.accepted)
    assert on.engine.pool.num_live_seqs == 0


def test_mtp_kv_equals_plain_forward(hf_model):
    """Record each layer's KV the moment the drafter declares it teacher-forced (prefill
    chunks, then verified tokens) and compare it with a plain forward over the final
    sequence: the target's hidden states from transformers, the MTP layers from the weights."""
    loaded = _loaded(hf_model, two_token_head=True)
    llm = LLM("tiny", loaded=loaded, speculative="mtp", **OPTS)
    eng = llm.engine
    drafter = eng.spec.drafter
    assert isinstance(drafter, MTPDrafter)
    L = eng.model_config.num_layers
    seen = [dict() for _ in range(K)]          # layer -> {position: (k, v)}
    prefill_done = [0] * K
    advance = drafter._advance

    def spy(live):
        before = {id(s): list(st.valid) for s, st in live}
        advance(live)
        for s, st in live:
            for k in range(K):
                a, b = before[id(s)][k], st.valid[k]
                if b <= a:
                    continue
                slots = eng.pool.swa_slots(s.kv, a, b)
                kc, vc = eng.runner.kv[L + k]
                for i, p in enumerate(range(a, b)):
                    assert p not in seen[k]
                    seen[k][p] = (kc[slots[i]].clone(), vc[slots[i]].clone())
                if s.in_prefill:
                    prefill_done[k] = b
    drafter._advance = spy
    proposals = []                             # (computed length, drafts)
    propose = drafter.propose

    def spy_propose(seqs, k):
        out = propose(seqs, k)
        proposals.extend((s.num_computed, d) for s, d in zip(seqs, out))
        return out
    drafter.propose = spy_propose
    prompt = _prompts(2, 5)[1]                  # 9 + some tokens: several prefill chunks
    seq = _step_all(llm, [prompt], [SamplingParams(temperature=0, max_tokens=20,
                                                    ignore_eos=True)])[0]
    ids = seq.all_ids
    # Prefill alone made layer k's KV for every prompt position whose token p + k + 1 it
    # knew: the prompt's and the one its last chunk sampled.
    assert prefill_done == [len(prompt) - k for k in range(K)]
    M = len(ids) - K
    with torch.no_grad():
        h = hf_model.model(torch.tensor([ids])).last_hidden_state[0, :M]
    w = loaded.weights
    refs = []
    for k in range(K):
        h, kk, vv = plain_mtp(w, k, torch.tensor(ids[k + 1:k + 1 + M]), h, hf_model.config,
                              with_kv=True)
        # Contiguous from position 0; the step that finished the request (up to K + 1
        # tokens) needs no more MTP work.
        n = max(seen[k]) + 1
        assert set(seen[k]) == set(range(n)) and n >= len(ids) - k - 1 - (K + 1)
        n = min(n, M)
        got_k = torch.stack([seen[k][p][0] for p in range(n)])
        got_v = torch.stack([seen[k][p][1] for p in range(n)])
        torch.testing.assert_close(got_k, kk[:n], atol=1e-4, rtol=0)
        torch.testing.assert_close(got_v, vv[:n], atol=1e-4, rtol=0)
        refs.append(h)
    # Draft j + 1 from position M - 1 is layer j's prediction there, given that the drafts
    # before it are the tokens that really followed (else it answers a different context).
    head = w["lm_head.weight"]
    checked = 0
    for m, d in proposals:
        for j, t in enumerate(d):
            if m - 1 >= M or d[:j] != ids[m + 1:m + 1 + j]:
                break
            assert t == int((refs[j][m - 1] @ head.T).argmax()), (m, j)
            checked += 1
    assert checked >= len(proposals) > 10
    assert sum(eng.spec.totals.accepted) > 0


def test_draft_count_is_clamped_to_mtp_layers(hf_model):
    llm = LLM("tiny", loaded=_loaded(hf_model), speculative="mtp", num_draft_tokens=5, **OPTS)
    assert llm.engine.spec.k == K
    assert llm.engine.scheduler.swa_lag == K
    mc = dataclasses.replace(llm.engine.model_config, num_mtp_layers=0)
    with pytest.raises(ConfigError, match="needs a model with MTP"):
        make_drafter(SpecConfig(speculative="mtp"), mc)


def test_drafting_after_a_prefix_cache_hit_waits_for_exact_kv(hf_model):
    """A cache hit at s leaves no hidden states for [0, s): drafts start only once the chain
    reads KV computed for this request (layer j's output exact from s + (j + 1)(window - 1)),
    and immediately without a hit. Both runs give the same tokens."""
    llm = LLM("tiny", loaded=_loaded(hf_model), speculative="mtp", **OPTS)
    drafter, W = llm.engine.spec.drafter, llm.engine.runner.window
    log = []
    propose = drafter.propose

    def spy(seqs, k):
        out = propose(seqs, k)
        log.extend((s.num_computed, len(d)) for s, d in zip(seqs, out))
        return out
    drafter.propose = spy
    prompt = _prompts(2, 7)[1] + list(range(40, 60))
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)]
    first = _step_all(llm, [prompt], params)[0]
    assert first.cached_tokens == 0 and log[0] == (len(prompt), K)
    log.clear()
    again = _step_all(llm, [prompt], params)[0]
    s = again.cached_tokens
    assert s > 0 and again.output_ids == first.output_ids
    for m, n in log:
        want = sum(m - j >= s + (j + 1) * (W - 1) for j in range(K))
        assert n == want, (m, n, s)
    assert log[0][1] < K and log[-1][1] == K


def test_sampled_path_with_top_k_1_equals_plain_decoding(hf_model):
    """Sampled requests verify MTP drafts by rejection sampling (the drafts are point
    masses). With top_k=1 the target's distribution is a point mass too, so the result is
    deterministic and must equal plain decoding while drafts get accepted."""
    loaded = _loaded(hf_model, two_token_head=True)
    params = [SamplingParams(temperature=0.8, top_k=1, max_tokens=12, ignore_eos=True,
                             seed=i) for i in range(4)]
    prompts = _prompts(4, 3)
    want = _step_all(LLM("tiny", loaded=loaded, **OPTS), prompts, params)
    on = LLM("tiny", loaded=loaded, speculative="mtp", **OPTS)
    got = _step_all(on, prompts, params)
    assert [g.output_ids for g in got] == [w.output_ids for w in want]
    assert sum(on.engine.spec.totals.accepted) > 0


def test_preempted_requests_resume_with_identical_tokens(hf_model):
    """Optimistic admission in a tight pool: a request is preempted, re-prefilled (its MTP
    state rebuilt for the new pages), and every output equals plain decoding in a roomy
    pool. MTP drafts every step, so drafts must never take the pages other decodes need
    for their own token (a crash with OutOfPages before the scheduler reserved them)."""
    loaded = _loaded(hf_model, two_token_head=True)
    prompts = _prompts(6, 9)
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * 6
    want = _step_all(LLM("tiny", loaded=loaded, **OPTS), prompts, params)
    tight = dict(OPTS, kv_cache_memory="200KiB")
    llm = LLM("tiny", loaded=loaded, speculative="mtp", admission="optimistic", swa_share=0.75,
              **tight)
    got = _step_all(llm, prompts, params)
    assert sum(g.preemptions for g in got) > 0
    assert [g.output_ids for g in got] == [w.output_ids for w in want]


def test_window_rebuild_with_mtp_layers_gives_plain_tokens(hf_model):
    """A window rebuild recomputes the SWA receptive field of the main and MTP layers alike
    ((3 + K) x (window - 1) tokens here): with drafting on, the tokens after it equal plain
    decoding without any cache."""
    loaded = _loaded(hf_model)
    rng = random.Random(3)
    shared = [rng.randrange(3, 300) for _ in range(64)]
    a = shared + [rng.randrange(3, 300) for _ in range(20)]
    b = shared + [rng.randrange(3, 300) for _ in range(9)]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    opts = {**OPTS, "max_num_batched_tokens": 128}   # one chunk: a's window at 64 speculative
    plain = LLM("tiny", loaded=loaded, prefix_cache=False, **opts)
    want = [_step_all(plain, [p], params)[0].output_ids for p in (a, b)]
    llm = LLM("tiny", loaded=loaded, speculative="mtp", **opts)
    tree, W = llm.engine.cache.tree, llm.engine.runner.window
    got_a = _step_all(llm, [a], params)[0]
    drop_speculative_windows(llm)       # a's chunk left SWA before every page: gone
    safe = tree.match(b[:-1], count=False, rebuild=0).length
    got_b = _step_all(llm, [b], params)[0]
    R = (3 + K) * (W - 1)
    assert llm.engine.cache.rebuild == R
    assert safe < got_b.cached_tokens <= 64 - R
    assert [got_a.output_ids, got_b.output_ids] == want
