"""Optimistic admission: more requests run than could all finish at once; when decoding
runs out of full-pool pages the newest request is preempted, rejoins the queue and resumes.
Greedy tokens are the same as in a roomy pool; nothing leaks."""
import pytest
from helpers.tiny_models import loaded_from_hf, random_prompts, tiny_gemma3_hf

from mimo import LLM, SamplingParams


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=11, sliding_window=16))


def _prompts():
    return random_prompts(5, (40, 70, 33, 90, 52, 61))


PARAMS = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)


def _drain(llm, prompts):
    eng = llm.engine
    seqs = [eng.add_request(p, PARAMS) for p in prompts]
    most = 0
    for _ in range(20_000):
        if not eng.has_work():
            break
        eng.step()
        most = max(most, len(eng.scheduler.running))
        eng.check_integrity()
    else:
        pytest.fail("engine did not drain")
    eng.check_integrity()
    return [s.output_ids for s in seqs], sum(s.preemptions for s in seqs), most


@pytest.mark.parametrize("cache", [True, False])
def test_preempted_requests_resume_with_identical_tokens(loaded, cache):
    kw = dict(dtype="float32", page_size=8, max_num_batched_tokens=64, progress=False,
              prefix_cache=cache)
    want, _, _ = _drain(LLM("tiny", loaded=loaded, kv_cache_memory="64MiB", **kw), _prompts())
    # Full pool of ~60 pages: every request fits alone (<= 19 pages), not all six together.
    tight = LLM("tiny", loaded=loaded, kv_cache_memory="1144KiB", swa_share=0.895,
                admission="optimistic", **kw)
    assert 40 <= tight.engine.pool.full.allocator.capacity <= 80
    got, preemptions, most = _drain(tight, _prompts())
    assert preemptions > 0
    assert got == want
    # The same tight pool with reservation never preempts, and runs fewer at once.
    reserve = LLM("tiny", loaded=loaded, kv_cache_memory="1144KiB", swa_share=0.895,
                  admission="reserve", **kw)
    got_r, preemptions_r, most_r = _drain(reserve, _prompts())
    assert got_r == want and preemptions_r == 0 and most_r < most
