"""GGUF metadata as mimo's reader gives it (gguf_file.py) against the `gguf` package's
reader: every key and value equal, the long arrays (`GGUFArray`) element for element,
decoded only when read; a start that finds its tokenizer in the cache decodes none."""
import gguf
import pytest

from mimo.models import registry
from mimo.models import tokenizer_cache as tc
from mimo.models.gguf_file import LAZY_ITEMS, GGUFArray, read_gguf_metadata
from mimo.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def gemma_path():
    return registry.resolve("gemma-3-270m")


def test_every_value_is_the_package_readers(gemma_path):
    ours = read_gguf_metadata(gemma_path)
    reader = gguf.GGUFReader(gemma_path)
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == theirs.keys()
    lazy = {k for k, v in ours.items() if isinstance(v, GGUFArray)}
    assert lazy == {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
    for k, v in ours.items():
        if k in lazy:
            assert len(v) == len(theirs[k]) > LAZY_ITEMS and v._items is None   # not decoded
            assert list(v) == theirs[k] and v == theirs[k], k
            assert v[5] == theirs[k][5] and v[-3:] == theirs[k][-3:]
        else:
            assert v == pytest.approx(theirs[k]) if isinstance(v, float) else v == theirs[k], k


def test_stored_bytes_are_the_files(gemma_path):
    reader = gguf.GGUFReader(gemma_path)
    raw = open(gemma_path, "rb").read()
    md = read_gguf_metadata(gemma_path)
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.tokens"):
        field = reader.fields[key]
        start = int(field.offset) + 8 + len(key) + 4     # key length, key, value type
        end = start + sum(int(p.nbytes) for p in field.parts[3:])
        assert md[key].stored() == raw[start:end], key


def test_a_cached_tokenizer_decodes_no_long_array(gemma_path, tmp_path, monkeypatch):
    monkeypatch.setenv("MIMO_CACHE_DIR", str(tmp_path))
    first = Tokenizer.from_gguf(read_gguf_metadata(gemma_path))      # builds the entry
    md = read_gguf_metadata(gemma_path)
    again = Tokenizer.from_gguf(md)
    assert all(v._items is None for v in md.values() if isinstance(v, GGUFArray))
    assert len(list(tc.cache_root().glob("*.json"))) == 1
    text = "Hello  world\n\n<start_of_turn>user\nnaïve café 東京 🙂<end_of_turn>"
    assert again.encode(text) == first.encode(text)


def test_the_key_reads_the_stored_bytes(gemma_path):
    """One token changed in the file's bytes is another key; the same bytes, the same key."""
    md = read_gguf_metadata(gemma_path)
    tokens = md["tokenizer.ggml.tokens"]
    changed = GGUFArray(tokens.item, len(tokens), tokens._data.replace(b"<bos>", b"<BOS>", 1))
    assert tc.metadata_key(md) == tc.metadata_key(read_gguf_metadata(gemma_path))
    assert tc.metadata_key({**md, "tokenizer.ggml.tokens": changed}) != tc.metadata_key(md)
