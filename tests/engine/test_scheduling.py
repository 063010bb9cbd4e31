"""Waiting-queue policies inside the real scheduler (tiny model): who is admitted first."""
import pytest
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.config import ConfigError

P = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=9, max_position_embeddings=2048))


def _finish_order(loaded, policy, **kw):
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="8MiB", max_num_seqs=1,
              policy=policy, **kw)
    eng = llm.engine
    seqs = {"long": eng.add_request([7] * 600, P), "short": eng.add_request([9] * 8, P),
            "mid": eng.add_request([11] * 100, P)}
    order = []
    while eng.has_work():
        eng.step()
        for name, s in seqs.items():
            if s.finish_reason and name not in order:
                order.append(name)
    eng.check_integrity()
    return order


def test_fcfs_admits_in_arrival_order(loaded):
    assert _finish_order(loaded, "fcfs") == ["long", "short", "mid"]


def test_compute_aware_admits_fewest_uncached_tokens_first(loaded):
    assert _finish_order(loaded, "compute-aware") == ["short", "mid", "long"]


def test_aging_lets_an_old_long_request_go_first(loaded):
    # A tiny aging window (1e9 tokens/s): waiting a moment outweighs any length difference.
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="8MiB", max_num_seqs=1,
              policy="compute-aware", aging_per_second=1e9)
    eng = llm.engine
    clock = [0.0]
    eng.scheduler.clock = lambda: clock[0]
    long = eng.add_request([7] * 600, P)
    clock[0] = 1.0
    short = eng.add_request([9] * 8, P)
    eng.step()
    assert long in eng.scheduler.running and short not in eng.scheduler.running
    while eng.has_work():
        eng.step()
    eng.check_integrity()


def test_length_buckets_keep_prefills_apart(loaded):
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="8MiB",
              policy="fcfs", length_buckets=(64,), max_num_batched_tokens=2048)
    eng = llm.engine
    for n in (300, 8, 400, 9):
        eng.add_request([7] * n, P)
    seen_buckets = set()
    while eng.has_work():
        chunks = eng.scheduler.schedule()
        prefill = {c.seq.prompt_ids.__len__() >= 64 for c in chunks if c.seq.in_prefill}
        assert len(prefill) <= 1, "short and long prompts shared a prefill batch"
        seen_buckets |= prefill
        hidden = eng.runner.execute(chunks)
        from mimo.gpu.sampling import sample
        toks = sample(eng.model.lm_head, hidden, [c.seq.params for c in chunks if c.sample],
                      [c.seq.generator for c in chunks if c.sample])
        for c, t in zip([c for c in chunks if c.sample], toks):
            c.seq.append(t)
        eng.scheduler.commit(chunks)
    assert seen_buckets == {True, False}
    eng.check_integrity()


@pytest.mark.parametrize("opts, match", [
    (dict(policy="lifo"), "policy"), (dict(aging_per_second=0), "aging"),
    (dict(length_buckets=(100, 50)), "length_buckets")])
def test_bad_scheduler_options(opts, match):
    with pytest.raises(ConfigError, match=match):
        LLM("tiny", **opts)
