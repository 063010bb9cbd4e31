"""AsyncEngine.build: the engine is loaded on the thread that steps it (libgomp spins its idle
workers only while the process holds no more OpenMP threads than CPUs, so loading on one
thread and stepping on another makes every parallel region wake sleeping workers)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from mimo.engine.async_engine import AsyncEngine
from mimo.engine.engine import LLMEngine
from mimo.engine.sampling_params import SamplingParams
from mimo.llm import engine_config

OPTS = {"dtype": "float32", "kv_cache_memory": "4MiB", "page_size": 4}


def test_built_and_stepped_on_one_thread_and_answers(tiny_hf_dir):
    threads: dict[str, set[int]] = {"built": set(), "stepped": set()}

    def factory() -> LLMEngine:
        threads["built"].add(threading.get_ident())
        eng = LLMEngine(engine_config(str(tiny_hf_dir[0]), **OPTS), progress=False)
        step = eng.step

        def recorded():
            threads["stepped"].add(threading.get_ident())
            return step()
        eng.step = recorded
        return eng

    ae = AsyncEngine.build(factory)
    assert threads["built"] and threading.get_ident() not in threads["built"]
    assert ae.info.vocab_size > 0                     # the face is there before start()

    async def run() -> list[int]:
        ae.start()
        try:
            out: list[int] = []
            async for ev in ae.submit([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=6,
                                                                   ignore_eos=True)):
                out += ev.token_ids
            return out
        finally:
            await ae.stop()

    tokens = asyncio.run(run())
    assert len(tokens) == 6
    assert threads["stepped"] == threads["built"]      # every step on the loading thread


def test_a_failed_build_raises_on_the_caller_and_leaves_no_thread():
    def factory() -> LLMEngine:
        raise ValueError("no such model: nope")

    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ValueError, match="no such model"):
        AsyncEngine.build(factory)
    assert {t.ident for t in threading.enumerate()} <= before


def test_stopped_before_started_ends_its_thread(tiny_hf_dir):
    ae = AsyncEngine.build(lambda: LLMEngine(engine_config(str(tiny_hf_dir[0]), **OPTS), progress=False))
    asyncio.run(ae.stop())
    assert ae._thread is not None and not ae._thread.is_alive()
