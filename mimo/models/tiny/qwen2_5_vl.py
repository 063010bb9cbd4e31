"""A tiny random-weight Qwen2.5-VL checkpoint, written as a complete Hugging Face directory
(config.json in transformers 5's text_config/vision_config layout, model.safetensors in its
`model.language_model.*` / `model.visual.*` naming, a byte-level BPE tokenizer.json trained
here with Qwen2.5-VL's special tokens, tokenizer_config.json with Qwen2.5-VL's chat template,
preprocessor_config.json, generation_config.json). Loads in transformers and in mimo.

For tests, demos and plumbing: shapes keep Qwen2.5-VL's structure (window + full attention
vision layers, 2x2 merger, GQA, M-RoPE) at widths a CPU runs in milliseconds. No downloads.

    python -m mimo.models.make_tiny qwen2_5_vl DIR     # (the dispatcher calls write())
"""
from __future__ import annotations

import json
import pathlib

import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
           "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL / Qwen2.5-VL's chat template (tokenizer_config.json of the Instruct checkpoints):
# each image or video becomes <|vision_start|><|image_pad|><|vision_end|>; the processor then
# repeats the pad token once per merged patch.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# Qwen2's pre-tokenizer split (digits one by one).
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

VOCAB = 512
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
            hidden_act="silu", rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                                "mrope_section": [2, 3, 3]})
VISION = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
              fullatt_block_indexes=[1, 3], window_size=112, patch_size=14,
              temporal_patch_size=2, spatial_merge_size=2, in_channels=3, tokens_per_second=2,
              hidden_act="silu")


def _tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = ["Describe the image. What is in this picture? A cat sits on a red sofa.",
              "What happens in the video? The dog runs across the green field.",
              "You are a helpful assistant. The quick brown fox jumps over the lazy dog.",
              "user assistant system hello world, hello mimo 0123456789"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=VOCAB - 16, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _rnd(gen):
    def rnd(*shape, std=0.08):
        return torch.randn(*shape, generator=gen) * std
    return rnd


def _text_weights(text: dict, vocab: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    rnd = _rnd(gen)

    def norm(n):   # around 1, so a wrong norm convention shows
        return 1.0 + rnd(n, std=0.1)

    w: dict[str, torch.Tensor] = {}
    H, inter, heads, kv = (text[k] for k in ("hidden_size", "intermediate_size",
                                         "num_attention_heads", "num_key_value_heads"))
    hd = H // heads
    lm = "model.language_model."
    w[lm + "embed_tokens.weight"] = rnd(vocab, H, std=0.5)
    for i in range(text["num_hidden_layers"]):
        p = f"{lm}layers.{i}."
        for n, rows in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            w[p + f"self_attn.{n}.weight"] = rnd(rows, H)
            w[p + f"self_attn.{n}.bias"] = rnd(rows)
        w[p + "self_attn.o_proj.weight"] = rnd(H, heads * hd)
        w[p + "mlp.gate_proj.weight"] = rnd(inter, H)
        w[p + "mlp.up_proj.weight"] = rnd(inter, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, inter)
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
    w[lm + "norm.weight"] = norm(H)
    w["lm_head.weight"] = rnd(vocab, H)
    return w


def vision_weights(vision: dict, gen: torch.Generator, prefix: str = "model.visual."
                   ) -> dict[str, torch.Tensor]:
    """Random weights of a Qwen2.5-VL vision tower of the given (HF vision_config) shape,
    in HF naming under `prefix` (the encoder bench builds realistic widths with it)."""
    rnd = _rnd(gen)

    def norm(n):
        return 1.0 + rnd(n, std=0.1)

    w: dict[str, torch.Tensor] = {}
    E, VI, out = vision["hidden_size"], vision["intermediate_size"], vision["out_hidden_size"]
    P, T, C = vision["patch_size"], vision["temporal_patch_size"], vision["in_channels"]
    # Scaled so activations keep unit size at any width (no blow-up in deep, wide benches).
    s = lambda fan_in: fan_in ** -0.5   # noqa: E731
    v = prefix
    w[v + "patch_embed.proj.weight"] = rnd(E, C, T, P, P, std=s(C * T * P * P))
    for i in range(vision["depth"]):
        p = f"{v}blocks.{i}."
        w[p + "norm1.weight"], w[p + "norm2.weight"] = norm(E), norm(E)
        w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"] = rnd(3 * E, E, std=s(E)), rnd(3 * E)
        w[p + "attn.proj.weight"], w[p + "attn.proj.bias"] = rnd(E, E, std=s(E)), rnd(E)
        for n, shape in (("gate_proj", (VI, E)), ("up_proj", (VI, E)), ("down_proj", (E, VI))):
            w[p + f"mlp.{n}.weight"] = rnd(*shape, std=s(shape[1]))
            w[p + f"mlp.{n}.bias"] = rnd(shape[0])
    M = E * vision["spatial_merge_size"] ** 2
    w[v + "merger.ln_q.weight"] = norm(E)
    w[v + "merger.mlp.0.weight"], w[v + "merger.mlp.0.bias"] = rnd(M, M, std=s(M)), rnd(M)
    w[v + "merger.mlp.2.weight"], w[v + "merger.mlp.2.bias"] = rnd(out, M, std=s(M)), rnd(out)
    return w


def write(out_dir: pathlib.Path, seed: int = 0) -> None:
    from safetensors.torch import save_file
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    config = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "dtype": "float32", "tie_word_embeddings": False,
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "text_config": {"model_type": "qwen2_5_vl_text", "vocab_size": VOCAB,
                        "bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad, **TEXT},
        "vision_config": {"model_type": "qwen2_5_vl_vision", **VISION},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    gen = torch.Generator().manual_seed(seed)
    weights = {**_text_weights(TEXT, VOCAB, gen), **vision_weights(VISION, gen)}
    save_file({k: v.contiguous() for k, v in weights.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
        "add_prefix_space": False, "model_max_length": TEXT["max_position_embeddings"],
        "errors": "replace", "split_special_tokens": False, "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {}}, indent=2))
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": pad, "eos_token_id": [eos, pad], "pad_token_id": pad,
        "do_sample": False}, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "min_pixels": 3136,
        "max_pixels": 12845056, "patch_size": VISION["patch_size"],
        "temporal_patch_size": VISION["temporal_patch_size"],
        "merge_size": VISION["spatial_merge_size"]}, indent=2))
