"""`python -m mimo.models.make_tiny ARCH DIR` writes a checkpoint that transformers loads and
mimo serves: same tokenizer ids, same logits, same greedy tokens, a working chat template."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from mimo import LLM, SamplingParams
from mimo.config import ConfigError
from mimo.models import make_tiny
from mimo.models.chat_template import ChatTemplate

ARCHS = ["gemma3", "mimo_v2_flash"]
TEXT = "Hello world, the quick brown fox jumps over the lazy dog!"


@pytest.fixture(scope="module", params=ARCHS)
def written(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d = tmp_path_factory.mktemp(request.param)
    assert make_tiny.main([request.param, str(d), "--seed", "3"]) == 0
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    llm = LLM(str(d), dtype="float32", kv_cache_memory="2MiB", page_size=4, progress=False)
    yield request.param, d, ref, AutoTokenizer.from_pretrained(d), llm
    llm.engine.check_integrity()


def _ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_available_lists_the_writers():
    assert set(ARCHS) <= set(make_tiny.available())
    with pytest.raises(ConfigError, match="available: .*gemma3"):
        make_tiny.write("no_such_arch", "/nonexistent")


def test_files_and_tokenizer_round_trip(written):
    arch, d, _, hf_tok, llm = written
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (d / name).is_file(), name
    ids = llm.tokenizer.encode(TEXT)
    assert ids == hf_tok(TEXT)["input_ids"]
    assert llm.tokenizer.decode(ids) == TEXT
    assert max(ids) < llm.engine.model_config.vocab_size


def test_logits_match_transformers(written):
    _, _, ref, _, llm = written
    ids = llm.tokenizer.encode(TEXT)
    torch.testing.assert_close(llm.engine.prompt_logits(ids, chunk=5), _ref_logits(ref, ids),
                               atol=1e-4, rtol=0)


def test_generates_like_transformers(written):
    _, _, ref, _, llm = written
    out = llm.generate(TEXT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    ids = list(out.prompt_token_ids)
    for _ in range(5):
        ids.append(int(_ref_logits(ref, ids)[-1].argmax()))
    assert out.token_ids == ids[len(out.prompt_token_ids):]


def test_chat_template_matches_transformers(written):
    _, _, _, hf_tok, llm = written
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "What is 2 + 2?"}]
    tmpl = ChatTemplate.for_model(llm.tokenizer, llm.engine.model_config.arch)
    assert tmpl.origin == "tokenizer"
    ours = tmpl.encode(llm.tokenizer, messages)
    want = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ours == list(want)


def test_mimo_checkpoint_carries_mtp_layers(tmp_path):
    make_tiny.write("mimo_v2_flash", tmp_path, seed=0)
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory="2MiB", page_size=4,
              progress=False)
    assert llm.engine.model_config.num_mtp_layers == 2
    assert len(llm.engine.model.mtp) == 2


def test_same_seed_same_checkpoint(tmp_path):
    for sub in ("a", "b"):
        make_tiny.write("mimo_v2_flash", tmp_path / sub, seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    make_tiny.write("mimo_v2_flash", tmp_path / "c", seed=2)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != \
        (tmp_path / "c" / "model.safetensors").read_bytes()
