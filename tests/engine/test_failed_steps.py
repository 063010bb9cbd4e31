"""A step that raises fails only the requests it touched: they end with reason 'error', their
KV is freed and none of it is cached, and the next step goes on with the others (which still
get their reference tokens). An inconsistent engine after a failure is reported as broken,
and the async loop then stops: every stream gets the error and `fatal` is set."""
import asyncio

import pytest
from helpers.tiny_models import loaded_from_hf, random_prompts, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.decode_step import PlainDecode
from mimo.engine.engine import EngineBroken, StepFailed
from mimo.engine.parts import EngineParts
from mimo.engine.prefill_planner import ChunkedPrefill
from mimo.kvcache.pool.allocator import OutOfPages

OPTS = dict(dtype="float32", kv_cache_memory="4MiB", page_size=4, max_num_batched_tokens=16,
            progress=False)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=3, sliding_window=8))


def _prompts():
    return random_prompts(4, (30, 45, 21))


class FailOnce(ChunkedPrefill):
    """Raises inside `schedule()` (as a pool running out there did) for one prompt, once."""
    def __init__(self, bad_len: int, exc: Exception | None = None):
        self.bad_len, self.exc, self.raised = bad_len, exc or OutOfPages("injected"), 0

    def plan(self, seq, remaining, budget, room):
        if len(seq.prompt_ids) == self.bad_len and not self.raised:
            self.raised += 1
            raise self.exc
        return super().plan(seq, remaining, budget, room)


def _reference(loaded, prompts):
    llm = LLM("tiny", loaded=loaded, prefix_cache=False, **OPTS)
    return [o.token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)]


@pytest.mark.parametrize("admission", ["reserve", "optimistic"])
def test_a_step_that_raises_in_schedule_fails_only_its_requests(loaded, admission):
    prompts = _prompts()
    want = _reference(loaded, prompts)
    step = FailOnce(bad_len=45)
    eng = LLM("tiny", loaded=loaded, parts=EngineParts(prefill=step), admission=admission,
              **OPTS).engine
    seqs = [eng.add_request(p, GREEDY) for p in prompts]
    failures = []
    for _ in range(500):
        if not eng.has_work():
            break
        try:
            eng.step()
        except StepFailed as e:
            failures.append(e)
        eng.check_integrity()
    assert not eng.has_work(), "the engine did not drain after a failed step"
    assert len(failures) == 1 and step.raised == 1
    assert failures[0].failed == [seqs[1]] and seqs[1].finish_reason == "error"
    assert eng.failed_steps == 1
    assert [seqs[0].output_ids, seqs[2].output_ids] == [want[0], want[2]]
    # Nothing of a failed request went into the cache: its prompt matches nothing.
    assert eng.cache.cached_len(prompts[1] + [0]) == 0
    eng.check_integrity()       # idle: no page in use


class BreakTheTree(PlainDecode):
    """A forward that fails after corrupting the pools: nothing can be trusted after it."""
    def execute(self, runner, head, chunks):
        alloc = runner.pool.full.allocator
        alloc._free.append(alloc._free[-1])     # a page twice on the free list
        raise RuntimeError("injected")


def test_an_inconsistent_engine_is_reported_broken(loaded):
    eng = LLM("tiny", loaded=loaded, parts=EngineParts(decode=BreakTheTree()), **OPTS).engine
    eng.add_request(_prompts()[0], GREEDY)
    with pytest.raises(EngineBroken):
        eng.step()


def test_the_async_loop_fails_streams_and_goes_on_then_stops_when_broken(loaded):
    prompts = _prompts()
    want = _reference(loaded, prompts)

    async def main():
        eng = LLM("tiny", loaded=loaded, parts=EngineParts(prefill=FailOnce(bad_len=45)),
                  **OPTS).engine
        ae = AsyncEngine(eng)
        fatal = []
        ae.on_fatal = fatal.append
        ae.start()
        streams = [ae.submit(p, GREEDY) for p in prompts]

        async def collect(st):
            toks = []
            try:
                async for ev in st:
                    toks += ev.token_ids
            except StepFailed:
                return "error"
            return toks
        got = await asyncio.wait_for(asyncio.gather(*map(collect, streams)), 60)
        assert got[1] == "error"
        assert [got[0], got[2]] == [want[0], want[2]]
        assert ae.fatal is None and not fatal
        # Now break it: the loop stops, the stream gets the error, fatal is set.
        eng.decode = BreakTheTree()
        st = ae.submit(prompts[0], GREEDY)
        with pytest.raises(EngineBroken):
            async for _ in st:
                pass
        for _ in range(100):
            if fatal:
                break
            await asyncio.sleep(0.01)
        assert isinstance(ae.fatal, EngineBroken) and fatal == [ae.fatal]
        with pytest.raises(RuntimeError, match="stopped"):
            ae.submit(prompts[0], GREEDY)
        await ae.stop()
    asyncio.run(main())
