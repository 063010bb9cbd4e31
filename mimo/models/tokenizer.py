"""Text <-> token ids, built from a GGUF file's metadata or a Hugging Face `tokenizer.json`.

A GGUF carries no `tokenizer.json`, only llama.cpp's description of one. We rebuild the same
`tokenizers` pipeline transformers' GGUF integration builds (so ids match it exactly), without
importing transformers: it takes ~20 s on a 262k vocabulary, this takes a few seconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

from .gguf_file import read_gguf_metadata
from .tokenizer_cache import cached_backend

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_SPIECE = "\u2581"
# Chat models end a turn with one of these rather than with the tokenizer's eos; a server must stop on both.
_END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>")

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Byte-level vocabularies were trained on text split by a model-specific regex; `tokenizer.ggml.pre`
# names it. Names not listed keep GPT-2's split, as transformers does.
_PRE_SPLITS = {**dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx",
                                 "smaug-bpe", "lfm2"), _LLAMA3),
               **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2),
               "gpt-4o": _GPT4O, "llama4": _GPT4O}



def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level vocabularies are spelled in."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {b: chr(b if b in keep else next(extra)) for b in range(256)}


def _merges_from_vocab(vocab: dict[str, int], scores: dict[str, float] | None) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, ordered as transformers' `generate_merges` orders them
    (best score first, then longer left piece). With `scores=None` file position is the rank, which
    needs no sort: the fast path that keeps a 262k vocabulary at ~1 s."""
    if scores is None:
        return [(t[:k], t[k:]) for t in vocab for k in range(len(t) - 1, 0, -1)
                if t[:k] in vocab and t[k:] in vocab]
    merges = []
    for token, score in scores.items():
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _sentencepiece_backend(md: Mapping[str, Any], arch: str) -> tuple[_Backend, list[str]]:
    tokens = list(md["tokenizer.ggml.tokens"])
    gemma = arch.startswith("gemma")
    if gemma:
        # Gemma files store runs of spaces as real spaces, but the normalizer turns spaces into
        # U+2581 before the model sees them, so those tokens must be spelled that way to be found.
        tokens = [_SPIECE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    if "tokenizer.ggml.merges" in md:
        merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    elif gemma:
        # Gemma's scores do not follow its merge order; the file order does.
        merges = _merges_from_vocab(vocab, None)
    else:
        if "tokenizer.ggml.scores" not in md:
            raise ValueError("GGUF sentencepiece tokenizer has neither tokenizer.ggml.merges "
                             "nor tokenizer.ggml.scores")
        merges = _merges_from_vocab(vocab, dict(zip(tokens, md["tokenizer.ggml.scores"])))
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else ("<unk>" if gemma else None)
    tok = _Backend(BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                       byte_fallback=True, dropout=None))
    steps = [decoders.Replace(_SPIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        # Gemma never prepends a space (HF's GemmaTokenizer), whatever add_space_prefix says.
        tok.normalizer = normalizers.Replace(" ", _SPIECE)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    elif arch == "phi3":
        # Phi-3 prefixes the space in the normalizer, which also spaces text that starts with one.
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(_SPIECE),
                                               normalizers.Replace(" ", _SPIECE)])
        steps.append(decoders.Strip(" ", 1, 0))
    else:
        # llama.cpp's flag; transformers ignores it and always prepends, which is the default when absent.
        prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(_SPIECE, prepend_scheme="first" if prefix else "never",
                                                     split=False)
        if prefix:
            steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok, tokens


def _byte_level_backend(md: Mapping[str, Any]) -> tuple[_Backend, list[str]]:
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # A few converters store some tokens as raw text; the model needs every one in the byte alphabet.
    tokens = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
              for t in md["tokenizer.ggml.tokens"]]
    if "tokenizer.ggml.merges" not in md:
        raise ValueError("GGUF byte-level (gpt2) tokenizer is missing tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = _Backend(BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
                       fuse_unk=False, dropout=None))
    split = _PRE_SPLITS.get(md.get("tokenizer.ggml.pre", ""))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, tokens


def _special_ids(md: Mapping[str, Any]) -> dict[str, int | None]:
    return {name: md.get(f"tokenizer.ggml.{name}_token_id")
            for name in ("bos", "eos", "unknown", "padding")}


def _gguf_backend(md: Mapping[str, Any]) -> _Backend:
    """The complete `tokenizers` pipeline for GGUF metadata (seconds on a 262k vocabulary:
    `cached_backend` keeps the result)."""
    kind, arch = md["tokenizer.ggml.model"], md.get("general.architecture", "")
    if kind == "llama":
        tok, tokens = _sentencepiece_backend(md, arch)
    elif kind == "gpt2":
        tok, tokens = _byte_level_backend(md)
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (supported: 'llama', 'gpt2')")

    ids = _special_ids(md)
    types = list(md.get("tokenizer.ggml.token_type", []))
    # Control tokens must match whole and be dropped on decode; a byte-level control token
    # spelled outside the byte alphabet is a converter mislabel that the model never saw.
    raw = md["tokenizer.ggml.tokens"]
    named = {i for i in ids.values() if i is not None and i < len(tokens)}
    special = [AddedToken(tokens[i], normalized=False, special=True) for i in range(len(tokens))
               if (i < len(types) and types[i] == _CONTROL and (kind != "gpt2" or tokens[i] == raw[i]))
               or i in named]
    tok.add_special_tokens(special)
    vocab = tok.get_vocab(with_added_tokens=False)
    # User-defined tokens (gemma's "\n\n", "<table>") are matched whole by llama.cpp, but not special.
    user = [AddedToken(t, normalized=False, special=False) for i, t in enumerate(raw)
            if i < len(types) and types[i] == _USER_DEFINED and t in vocab]
    tok.add_tokens(user)
    return tok


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the model facts a server needs: BOS/EOS policy and chat template."""

    def __init__(self, backend: _Backend, *, bos_token_id: int | None, eos_token_id: int | None,
                 pad_token_id: int | None = None, add_bos: bool = False, add_eos: bool = False,
                 chat_template: str | None = None):
        self.backend = backend
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id
        self.add_bos = add_bos and bos_token_id is not None
        self.add_eos = add_eos and eos_token_id is not None
        self.chat_template = chat_template
        ends = {backend.token_to_id(t) for t in _END_OF_TURN} | {eos_token_id}
        self.eos_token_ids: set[int] = {i for i in ends if i is not None}

    @classmethod
    def from_gguf(cls, source: str | os.PathLike | Mapping[str, Any] | Any) -> Tokenizer:
        """From a GGUF path, a `gguf.GGUFReader`, or an already-read metadata mapping."""
        md: Mapping[str, Any]
        if isinstance(source, (str, os.PathLike)):
            md = read_gguf_metadata(source)
        elif hasattr(source, "fields"):  # gguf.GGUFReader
            md = {k: f.contents() for k, f in source.fields.items()
                  if k.startswith(("tokenizer.", "general."))}
        elif isinstance(source, Mapping):
            md = source
        else:
            raise TypeError(f"from_gguf expects a path, a gguf.GGUFReader or a metadata mapping, "
                            f"got {type(source)}")
        for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
            if key not in md:
                raise ValueError(f"GGUF metadata has no {key}; cannot build a tokenizer")
        kind = md["tokenizer.ggml.model"]
        if kind not in ("llama", "gpt2"):
            raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (supported: 'llama', 'gpt2')")
        tok = cached_backend(md, lambda: _gguf_backend(md))
        ids = _special_ids(md)

        add_bos = md.get("tokenizer.ggml.add_bos_token")
        if add_bos is None:
            add_bos = kind == "llama"  # llama.cpp adds BOS to sentencepiece vocabularies that do not say
        return cls(tok, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["padding"],
                   add_bos=bool(add_bos), add_eos=bool(md.get("tokenizer.ggml.add_eos_token", False)),
                   chat_template=md.get("tokenizer.chat_template"))

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """From a directory holding tokenizer.json (+ optional tokenizer_config.json,
        special_tokens_map.json)."""
        tok_file = Path(path, "tokenizer.json")
        if not tok_file.is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json")
        tok = _Backend.from_file(str(tok_file))

        def load(name: str) -> dict:
            file = Path(path, name)
            return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}

        cfg, smap = load("tokenizer_config.json"), load("special_tokens_map.json")

        def token_id(name: str) -> int | None:
            text = cfg.get(name) or smap.get(name)
            if isinstance(text, dict):  # a serialized AddedToken
                text = text.get("content")
            return tok.token_to_id(text) if text is not None else None

        bos, eos, pad = token_id("bos_token"), token_id("eos_token"), token_id("pad_token")
        # Without an explicit flag, the tokenizer.json post-processor is what decides, as in transformers.
        plain = tok.encode("a", add_special_tokens=False).ids
        full = tok.encode("a", add_special_tokens=True).ids
        add_bos, add_eos = cfg.get("add_bos_token"), cfg.get("add_eos_token")
        if add_bos is None:
            add_bos = len(full) > len(plain) and full[0] != plain[0] and (bos is None or full[0] == bos)
            bos = full[0] if add_bos else bos
        if add_eos is None:
            add_eos = len(full) > len(plain) and full[-1] != plain[-1] and (eos is None or full[-1] == eos)
            eos = full[-1] if add_eos else eos

        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            by_name = {t.get("name"): t.get("template") for t in template}
            template = by_name.get("default", next(iter(by_name.values()), None))
        jinja = Path(path, "chat_template.jinja")
        if template is None and jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        return cls(tok, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, add_bos=bool(add_bos),
                   add_eos=bool(add_eos), chat_template=template)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # BOS/EOS are added here rather than by the backend's post-processor so that the policy is
        # one flag we own, whatever post-processor a tokenizer.json happens to carry.
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:   # add_bos / add_eos hold only with the id set (__init__)
            if self.add_bos and self.bos_token_id is not None:
                ids = [self.bos_token_id, *ids]
            if self.add_eos and self.eos_token_id is not None:
                ids = [*ids, self.eos_token_id]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str | None:
        """The token as the vocabulary spells it (U+2581 for spaces, GPT-2 byte letters), not decoded text."""
        return self.backend.id_to_token(i)

    def token_to_id(self, s: str) -> int | None:
        return self.backend.token_to_id(s)
