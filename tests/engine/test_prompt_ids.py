"""LLMEngine.new_sequence refuses every prompt id that is not a plain int inside the
vocabulary (bools, floats, strings, None, negatives, the vocabulary size itself) with
a RequestError naming the rule, and builds a Sequence for any valid list."""
from __future__ import annotations

import pytest

from mimo.engine.engine import LLMEngine
from mimo.engine.errors import RequestError
from mimo.engine.sampling_params import SamplingParams
from mimo.llm import engine_config

OPTS = {"dtype": "float32", "kv_cache_memory": "4MiB", "page_size": 4}


@pytest.fixture(scope="module")
def engine(tiny_hf_dir):
    return LLMEngine(engine_config(str(tiny_hf_dir[0]), **OPTS), progress=False)


def test_bad_ids_are_refused(engine):
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=2)
    for bad in ([1, True], [1, 2.0], [1, "3"], [1, -1], [1, vocab], [None], [1, 2, 3, 2 ** 70]):
        with pytest.raises(RequestError, match=rf"integers in \[0, {vocab}\)"):
            engine.new_sequence(bad, params)


def test_good_ids_build_a_sequence(engine):
    vocab = engine.model_config.vocab_size
    ids = [0, 1, vocab - 1] * 1000
    seq = engine.new_sequence(ids, SamplingParams(max_tokens=2))
    assert seq.prompt_ids == ids
