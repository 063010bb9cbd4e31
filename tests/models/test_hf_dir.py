"""Loading a Hugging Face directory (config.json + safetensors + tokenizer.json)."""
import pytest
import torch

from mimo import LLM, SamplingParams


@pytest.fixture(scope="module")
def hf_dir(tiny_hf_dir):
    return tiny_hf_dir


def test_hf_directory_serves_text(hf_dir):
    d, ref = hf_dir
    llm = LLM(str(d), dtype="float32", kv_cache_memory="8MiB", progress=False)
    tok = llm.tokenizer
    ids = tok.encode("hello world, the quick brown fox")
    assert ids[0] == 2 and max(ids) < 512
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(llm.engine.prompt_logits(ids), want, atol=1e-4, rtol=0)
    out = llm.generate("hello world, the quick brown fox",
                       SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert out.prompt_token_ids == ids and len(out.token_ids) == 5
    assert out.text == tok.decode(out.token_ids)
    llm.engine.check_integrity()


def test_missing_weights_named(tmp_path, hf_dir):
    d, _ = hf_dir
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(tmp_path), dtype="float32", progress=False)
