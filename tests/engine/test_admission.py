"""When either pool is full, new requests wait, then run once memory frees; no deadlock, and
waiting changes no request's tokens."""
import pytest
from helpers.tiny_models import loaded_from_hf, random_prompts, tiny_gemma3_hf

from mimo import LLM, SamplingParams

P = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=7, sliding_window=32))


def _prompts():
    return random_prompts(3, (60, 90, 45, 120, 70, 100))


def _run(llm, prompts):
    eng = llm.engine
    seqs = [eng.add_request(p, P) for p in prompts]
    max_running, waited = 0, False
    for _ in range(10_000):
        if not eng.has_work():
            break
        eng.step()
        max_running = max(max_running, len(eng.scheduler.running))
        waited |= bool(eng.scheduler.waiting) and bool(eng.scheduler.running)
        eng.pool.check_integrity()
    else:
        pytest.fail("engine did not drain: deadlock")
    eng.check_integrity()
    return [s.output_ids for s in seqs], max_running, waited


@pytest.fixture(scope="module")
def roomy(loaded):
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="64MiB", page_size=8)
    return _run(llm, _prompts())


@pytest.mark.parametrize("which", ["full", "swa"])
def test_requests_wait_for_a_full_pool(loaded, roomy, which):
    want, roomy_running, _ = roomy
    assert roomy_running == 6
    # Shrink one pool until only about two requests fit at once; the other stays roomy.
    share = 0.96 if which == "full" else 0.1
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="2MiB", page_size=8,
              swa_share=share, max_num_batched_tokens=64)
    pool = llm.engine.pool
    per_token = {"full": pool.layout.full_bytes_per_token, "swa": pool.layout.swa_bytes_per_token}
    got, max_running, waited = _run(llm, _prompts())
    assert waited and 1 <= max_running < 6, f"{which}-pool limit not exercised ({max_running})"
    assert got == want
    assert per_token[which] > 0


def test_request_that_can_never_fit_is_refused(loaded):
    from mimo.engine.engine import RequestError
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="1MiB", page_size=8)
    with pytest.raises(RequestError, match="KV"):
        llm.generate({"prompt_token_ids": [5] * 3000}, SamplingParams(max_tokens=5))
    llm.engine.check_integrity()
