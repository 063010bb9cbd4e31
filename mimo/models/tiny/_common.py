"""What every tiny checkpoint writer shares: a small byte-level BPE tokenizer trained here on
a fixed text (no downloads), seeded random tensors, and the file writers."""
from __future__ import annotations

import json
from pathlib import Path

import torch

# Plain ASCII prose: the BPE merges are learnt from it; any text still round-trips, since a
# byte-level vocabulary spells every byte.
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello world, hello mimo! "
    "A sliding window attention layer sees only the most recent tokens, while a full "
    "attention layer sees the whole context. What is the capital of France? Paris is. "
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. def main(): return 42\n"
)


def byte_level_bpe(special_tokens: list[str], vocab_size: int):
    """A byte-level BPE tokenizer: the special tokens get ids 0..len-1 in the given order,
    then the 256 byte symbols, then merges learnt from CORPUS up to `vocab_size`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([CORPUS] * 4, trainer)
    return tok


class Randn:
    """Seeded normal tensors: the same seed writes the same checkpoint."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, *shape: int, std: float = 0.08, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g) * std + mean


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def write_weights(path: Path, weights: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path), metadata={"format": "pt"})


def write_tokenizer(out: Path, tok, config: dict) -> None:
    """tokenizer.json plus tokenizer_config.json (`config`: special token names, chat
    template, add_bos_token, ...)."""
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json",
               {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
                "clean_up_tokenization_spaces": False, **config})


def write_checkpoint(out_dir: Path, config: dict, weights: dict[str, torch.Tensor], tok,
                     tokenizer_config: dict, generation_config: dict) -> None:
    """A loadable directory: config.json, model.safetensors, the tokenizer files
    (`write_tokenizer`) and generation_config.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    write_weights(out / "model.safetensors", weights)
    write_tokenizer(out, tok, tokenizer_config)
    write_json(out / "generation_config.json", generation_config)
