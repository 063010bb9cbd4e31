"""Bad input: each a clear exception naming the problem, and nothing stays allocated."""
import pytest
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.config import ConfigError
from mimo.engine.engine import RequestError
from mimo.models.registry import ModelNotFound


@pytest.fixture(scope="module")
def llm():
    model = tiny_gemma3_hf(seed=8, max_position_embeddings=256)
    llm = LLM("tiny", loaded=loaded_from_hf(model), dtype="float32", kv_cache_memory="4MiB")
    yield llm
    llm.engine.check_integrity()


@pytest.fixture(autouse=True)
def nothing_leaks(llm):
    yield
    eng = llm.engine
    eng.check_integrity()
    assert not eng.scheduler.waiting and not eng.scheduler.running
    assert eng.pool.full.allocator.num_in_use == 0 and eng.pool.swa.allocator.num_in_use == 0


@pytest.mark.parametrize("prompt, match", [
    ({"prompt_token_ids": []}, "empty"),
    ("", "empty"),
    ({"prompt_token_ids": [5] * 256}, "context"),
    ({"prompt_token_ids": [5] * 250}, "exceeds the context"),      # + max_tokens 16 > 256
    ({"prompt_token_ids": [5, 512]}, r"\[0, 512\)"),
    ({"prompt_token_ids": [5, -1]}, r"\[0, 512\)"),
    ({"prompt_token_ids": [5, "a"]}, r"\[0, 512\)"),
    ({"prompt_token_ids": "5 6"}, "list of integers"),
    ({"tokens": [1, 2]}, "prompt_token_ids"),
    (42, "string or"),
    ("text needs a tokenizer", "tokenizer"),
])
def test_bad_prompt(llm, prompt, match):
    with pytest.raises(RequestError, match=match):
        llm.generate(prompt, SamplingParams(max_tokens=16))


def test_one_bad_prompt_queues_none_of_the_batch(llm):
    with pytest.raises(RequestError):
        llm.generate([{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": []}])


def test_prompt_and_params_count_must_agree(llm):
    with pytest.raises(ValueError, match="2 prompts but 3"):
        llm.generate([{"prompt_token_ids": [5]}] * 2, [SamplingParams()] * 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens must be >= 1"),
    (dict(max_tokens=-3), "max_tokens must be >= 1"),
    (dict(max_tokens=2.5), "max_tokens must be an integer"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(seed="x"), "seed"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
])
def test_bad_sampling_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_unknown_option_is_rejected():
    with pytest.raises(ConfigError, match="unknown option 'kv_cache_memry'"):
        LLM("tiny", kv_cache_memry="1GiB")


@pytest.mark.parametrize("opts, match", [
    (dict(dtype="float64"), "dtype"),
    (dict(kv_cache_memory="lots"), "cannot parse size"),
    (dict(page_size=0), "page_size"),
    (dict(swa_share=1.5), "swa_share"),
    (dict(layout="paged"), "layout"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(max_mixed_batched_tokens=0), "max_mixed_batched_tokens"),
])
def test_bad_engine_options(opts, match):
    with pytest.raises(ConfigError, match=match):
        LLM("tiny", **opts)


def test_unknown_model_name():
    with pytest.raises(ModelNotFound, match="unknown model 'gemma-9-9b'"):
        LLM("gemma-9-9b")


def test_unreadable_model_files(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        LLM(str(bad))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(ValueError, match="GGUF"):
        LLM(str(truncated))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(ModelNotFound, match="without config.json"):
        LLM(str(empty_dir))
    (empty_dir / "config.json").write_text("{not json")
    with pytest.raises(ModelNotFound, match="cannot read"):
        LLM(str(empty_dir))
    (empty_dir / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ConfigError, match="unsupported model_type 'bert'"):
        LLM(str(empty_dir))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0")
    with pytest.raises(ModelNotFound, match="neither"):
        LLM(str(other))
