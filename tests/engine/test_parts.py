"""The engine loop's parts are pluggable: a different decode step, prefix cache or prefill
planner goes in through `EngineParts`, and the scheduler and the other parts are untouched
(the same requests give the same tokens)."""
import pytest
from helpers.tiny_models import loaded_from_hf, random_prompts, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.engine.decode_step import DecodeStep
from mimo.engine.parts import EngineParts
from mimo.engine.prefill_planner import ChunkedPrefill
from mimo.kvcache.radix.cache import RadixPrefixCache

OPTS = dict(dtype="float32", kv_cache_memory="4MiB", page_size=8, max_num_batched_tokens=32,
            progress=False)
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=3, sliding_window=16))


def prompts():
    return [{"prompt_token_ids": ids} for ids in random_prompts(1, (20, 45, 33))]


class FullLogitsArgmax(DecodeStep):
    """Greedy through the full logits and torch.argmax (not the LM head's fast path)."""
    def __init__(self):
        self.calls = 0

    def execute(self, runner, head, chunks):
        self.calls += 1
        hidden = runner.execute(chunks)
        return [[int(t)] for t in head.logits(hidden).argmax(dim=-1)]


class CountingCache(RadixPrefixCache):
    def __init__(self, pool):
        super().__init__(pool)
        self.admits = 0

    def admit(self, *a, **kw):
        self.admits += 1
        return super().admit(*a, **kw)


def test_a_different_decode_step_gives_the_same_tokens(loaded):
    want = LLM("tiny", loaded=loaded, **OPTS).generate(prompts(), GREEDY)
    step = FullLogitsArgmax()
    llm = LLM("tiny", loaded=loaded, parts=EngineParts(decode=step), **OPTS)
    got = llm.generate(prompts(), GREEDY)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert step.calls >= GREEDY.max_tokens
    llm.engine.check_integrity()


def test_a_different_prefix_cache_plugs_into_the_scheduler(loaded):
    made = []

    def factory(pool):
        made.append(CountingCache(pool))
        return made[0]
    llm = LLM("tiny", loaded=loaded, parts=EngineParts(prefix_cache=factory), **OPTS)
    first = llm.generate(prompts(), GREEDY)
    again = llm.generate(prompts(), GREEDY)
    cache = made[0]
    assert llm.engine.scheduler.cache is cache and cache.admits >= 6
    assert [a.token_ids for a in again] == [f.token_ids for f in first]
    assert all(a.cached_tokens > 0 for a in again)
    llm.engine.check_integrity()


class SmallChunks(ChunkedPrefill):
    """At most 7 prompt tokens per request per step."""
    def __init__(self):
        self.largest = 0

    def plan(self, seq, remaining, budget, room):
        n = min(7, super().plan(seq, remaining, budget, room))
        self.largest = max(self.largest, n)
        return n


def test_a_different_prefill_planner_changes_chunking_not_tokens(loaded):
    want = LLM("tiny", loaded=loaded, **OPTS).generate(prompts(), GREEDY)
    step = SmallChunks()
    llm = LLM("tiny", loaded=loaded, parts=EngineParts(prefill=step), **OPTS)
    got = llm.generate(prompts(), GREEDY)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert step.largest == 7
    llm.engine.check_integrity()
