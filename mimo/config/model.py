"""What a model is: its shapes, layer kinds, windows, sinks, vision tower (data read from a
checkpoint's config)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import ConfigError, _from_dict


@dataclass(frozen=True)
class VisionConfig:
    """A Qwen2.5-VL style vision tower: ViT over 14x14 (x2 frames) patches with window attention
    on most layers and full attention on `fullatt_block_indexes`, then a 2x2 patch merger to the
    language model's width. `window_size` is in pixels (112 = 4x4 merged units = 8x8 patches)."""
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    fullatt_block_indexes: tuple[int, ...] = ()
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    tokens_per_second: float = 4.0
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    # Image preprocessing, from the checkpoint's preprocessor_config.json when it has one;
    # without one, Qwen2.5-VL's recommended serving bounds and the CLIP normalization.
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch row: channels x frames x pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VisionConfig:
        data = dict(data)
        for key in ("fullatt_block_indexes", "image_mean", "image_std"):
            if key in data:
                data[key] = tuple(data[key])
        return _from_dict(cls, data)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder. Layer kinds are per layer: 'full' or 'swa'.

    `sliding_window` counts the keys a query on an SWA layer may see, itself included
    (Gemma 3 / transformers semantics: keys in (pos - window, pos]).
    """
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_types: tuple[str, ...]
    # per layer kind: (num_kv_heads, qk_head_dim, v_head_dim)
    full_kv_heads: int
    swa_kv_heads: int
    head_dim: int
    v_head_dim: int
    swa_head_dim: int
    swa_v_head_dim: int
    sliding_window: int
    rope_theta: float
    rope_local_theta: float
    rms_norm_eps: float = 1e-6
    max_position: int = 32768
    query_pre_attn_scalar: float | None = None
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rope_scaling_factor: float = 1.0   # linear scaling of the full layers' RoPE (Gemma 3 4B+)
    # Partial RoPE: only the first `rotary_dim` (`swa_rotary_dim`) dims of each q/k head are
    # rotated (None: the whole head). MiMo-V2-Flash rotates 64 of 192.
    rotary_dim: int | None = None
    swa_rotary_dim: int | None = None
    # Learned per-head attention-sink logits on a layer kind (MiMo-V2-Flash: SWA layers).
    full_attention_sink: bool = False
    swa_attention_sink: bool = False
    attention_value_scale: float = 1.0   # V is multiplied by this before it is cached
    # Per-layer MLP kind, 'dense' or 'sparse' (MoE); empty: every layer dense.
    mlp_types: tuple[str, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_group: int = 1                 # group-limited routing: experts in n_group groups, ...
    topk_group: int = 1              # ... tokens pick experts from the best topk_group groups
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    # Multi-token-prediction layers after the last decoder layer. Their KV is cached as extra
    # SWA-kind layers (see `kv_layer_types`).
    num_mtp_layers: int = 0
    # Multimodal RoPE (Qwen2-VL family): rotary frequency pairs per (temporal, height, width)
    # axis, summing to head_dim / 2; None for plain 1-D RoPE.
    mrope_section: tuple[int, ...] | None = None
    attention_bias: bool = False       # q/k/v projections carry a bias (Qwen2)
    vision: VisionConfig | None = None # the vision tower of a vision-language model

    def __post_init__(self):
        if len(self.layer_types) != self.num_layers:
            raise ConfigError("layer_types must have one entry per layer")
        bad = set(self.layer_types) - {"full", "swa"}
        if bad:
            raise ConfigError(f"unknown layer type(s) {sorted(bad)}")
        if self.mlp_types and len(self.mlp_types) != self.num_layers:
            raise ConfigError("mlp_types must be empty or have one entry per layer")
        if set(self.mlp_types) - {"dense", "sparse"}:
            raise ConfigError(f"unknown mlp type(s) {sorted(set(self.mlp_types) - {'dense', 'sparse'})}")
        if "sparse" in self.mlp_types and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigError("sparse layers need 0 < num_experts_per_tok <= num_experts")
        if self.num_mtp_layers < 0:
            raise ConfigError("num_mtp_layers must be >= 0")
        if self.mrope_section is not None and 2 * sum(self.mrope_section) != self.head_dim:
            raise ConfigError(f"mrope_section {self.mrope_section} must sum to head_dim / 2 "
                              f"({self.head_dim // 2})")

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full")

    @property
    def swa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "swa")

    @property
    def kv_layer_types(self) -> tuple[str, ...]:
        """Kinds of every layer that owns KV cache: the decoder layers, then the MTP layers,
        which attend like SWA layers (same heads, dims and window) and so live in the SWA pool."""
        return self.layer_types + ("swa",) * self.num_mtp_layers

    def kv_shape(self, kind: str) -> tuple[int, int, int]:
        """(kv_heads, k_head_dim, v_head_dim) of a layer kind."""
        if kind == "full":
            return self.full_kv_heads, self.head_dim, self.v_head_dim
        return self.swa_kv_heads, self.swa_head_dim, self.swa_v_head_dim

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        if "layer_types" in data:
            data["layer_types"] = tuple(data["layer_types"])
        if "eos_token_ids" in data:
            data["eos_token_ids"] = tuple(data["eos_token_ids"])
        if "mlp_types" in data:
            data["mlp_types"] = tuple(data["mlp_types"])
        if data.get("mrope_section") is not None:
            data["mrope_section"] = tuple(data["mrope_section"])
        if isinstance(data.get("vision"), dict):
            data["vision"] = VisionConfig.from_dict(data["vision"])
        return _from_dict(cls, data)
