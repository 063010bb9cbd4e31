"""A tiny random Gemma 3 text checkpoint (transformers' Gemma3ForCausalLM layout): 6 layers,
5 SWA (window 8) then 1 full, GQA 4:2, head dim 16, q/k norms, tied head; Gemma's special
tokens and its chat template."""
from __future__ import annotations

from pathlib import Path

from ..chat_template import GEMMA3_TEMPLATE
from ._common import Randn, byte_level_bpe, write_checkpoint

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PAD, EOS, BOS, END_OF_TURN = 0, 1, 2, 5
VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 512, 64, 128, 6, 4, 2, 16, 8


def config() -> dict:
    types = ["sliding_attention"] * 5 + ["full_attention"]
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "query_pre_attn_scalar": HEAD_DIM, "sliding_window": WINDOW,
        "layer_types": types,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}},
        "attention_bias": False, "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "tie_word_embeddings": True, "pad_token_id": PAD, "eos_token_id": [EOS, END_OF_TURN],
        "bos_token_id": BOS, "dtype": "bfloat16"}


def weights(seed: int) -> dict:
    r = Randn(seed)
    # Gemma scales norms by (1 + w): w around 0. Stored in bf16, like released checkpoints.
    w = {"model.embed_tokens.weight": r(VOCAB, HIDDEN, std=0.5), "model.norm.weight": r(HIDDEN, std=0.3)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": r(HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.k_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.v_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.o_proj.weight": r(HIDDEN, HEADS * HEAD_DIM),
              p + "self_attn.q_norm.weight": r(HEAD_DIM, std=0.3),
              p + "self_attn.k_norm.weight": r(HEAD_DIM, std=0.3),
              p + "mlp.gate_proj.weight": r(INTER, HIDDEN), p + "mlp.up_proj.weight": r(INTER, HIDDEN),
              p + "mlp.down_proj.weight": r(HIDDEN, INTER)}
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = r(HIDDEN, std=0.3)
    return {k: v.bfloat16() for k, v in w.items()}


def write(out_dir: Path, seed: int = 0) -> None:
    tok = byte_level_bpe(SPECIAL, vocab_size=400)
    # Gemma's tokenizer prepends <bos>; the post-processor makes transformers do so too.
    from tokenizers import processors
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", BOS)])
    write_checkpoint(out_dir, config(), weights(seed), tok,
                     {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                      "unk_token": "<unk>", "add_bos_token": True, "chat_template": GEMMA3_TEMPLATE},
                     {"bos_token_id": BOS, "eos_token_id": [EOS, END_OF_TURN], "pad_token_id": PAD})
