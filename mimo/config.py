"""Frozen configuration, one dataclass per layer of the system.

Each component receives only its slice (the KV cache never sees the scheduler's config, the
scheduler never sees the model's weights). `from_dict` rejects unknown keys so a misspelt
option fails loudly instead of being silently ignored.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """An option has an invalid value or an unknown name."""


def _from_dict(cls, data: dict[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} option(s): {', '.join(unknown)}")
    return cls(**data)


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20,
          "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """'80GiB' -> bytes. Plain integers are bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise ConfigError(f"cannot parse size {text!r} (examples: 512MiB, 80GiB, 2TiB)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


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


# The prefix cache's SWA retention policies (kvcache/retention.py: POLICIES, same keys).
RETENTION_POLICIES = ("hybrid", "hybrid-output", "prompt-only", "keep-all")


@dataclass(frozen=True)
class CacheConfig:
    """KV cache sizing. `kv_cache_memory` is a byte budget shared by both pools;
    `swa_share` is the fraction of it given to the SWA pool (None: derived from the model's
    shapes so that both pools fill together for requests of `planning_context` tokens)."""
    page_size: int = 16
    kv_cache_memory: int = 2 * 2**30
    swa_share: float | None = None
    planning_context: int | None = None
    layout: str = "hybrid"   # 'hybrid' (SWA layers hold only their window) or 'full-kv'
    prefix_cache: bool = True           # the SWA-aware prefix cache (kvcache/radix_cache.py)
    retention: str = "hybrid-output"   # SWA retention policy of the prefix cache (kvcache/retention.py)
    # A prefix whose SWA window is gone is reused by recomputing only the SWA layers' KV of
    # the receptive field before its end (RadixTree.match `rebuild`); False: cut it back.
    window_rebuild: bool = True
    # Seconds a session paused in a tool call keeps its cached path and trailing window
    # after everything else (RadixTree.hold); 0: paused sessions age like any other.
    tool_pause_hold: float = 120.0

    def __post_init__(self):
        if self.page_size < 1:
            raise ConfigError("page_size must be >= 1")
        if self.kv_cache_memory <= 0:
            raise ConfigError("kv_cache_memory must be positive")
        if self.swa_share is not None and not 0.0 < self.swa_share < 1.0:
            raise ConfigError("swa_share must be in (0, 1)")
        if self.layout not in ("hybrid", "full-kv"):
            raise ConfigError("layout must be 'hybrid' or 'full-kv'")
        if self.retention not in RETENTION_POLICIES:
            raise ConfigError(f"retention must be one of {', '.join(RETENTION_POLICIES)}")
        if not 0 <= self.tool_pause_hold < float("inf"):
            raise ConfigError("tool_pause_hold must be a finite number of seconds >= 0")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CacheConfig:
        data = dict(data)
        if "kv_cache_memory" in data:
            data["kv_cache_memory"] = parse_size(data["kv_cache_memory"])
        return _from_dict(cls, data)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching: at most `max_num_seqs` running requests; each step schedules at
    most `max_num_batched_tokens` tokens (decode tokens first, then prefill chunks).

    `policy` orders the waiting queue: 'fcfs', or 'compute-aware' (fewest uncached prompt
    tokens first; a request's priority improves by `aging_per_second` tokens per second of
    waiting, so its wait is bounded by uncached/aging_per_second plus the work ahead of it).
    `length_buckets`: prompt-length cut points; one prefill batch takes one bucket only."""
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    policy: str = "compute-aware"
    aging_per_second: float = 1000.0
    length_buckets: tuple[int, ...] | None = None
    # 'reserve': admit a request only when prompt + max_tokens fit (it never waits for
    # memory once running); 'optimistic': admit when its prompt fits and preempt the newest
    # request when decoding runs out of full-pool pages (more requests run at once).
    admission: str = "reserve"

    def __post_init__(self):
        if self.admission not in ("reserve", "optimistic"):
            raise ConfigError("admission must be 'reserve' or 'optimistic'")
        if self.max_num_seqs < 1:
            raise ConfigError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_batched_tokens must be >= 1")
        if self.policy not in ("fcfs", "compute-aware"):
            raise ConfigError(f"policy must be fcfs or compute-aware, not {self.policy!r}")
        if not self.aging_per_second > 0:
            raise ConfigError("aging_per_second must be > 0 (0 would let requests starve)")
        if self.length_buckets is not None:
            b = list(self.length_buckets)
            if not b or any(x <= 0 for x in b) or b != sorted(set(b)):
                raise ConfigError("length_buckets must be increasing positive token counts")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SchedulerConfig:
        return _from_dict(cls, data)


QUANTIZE = ("auto", "none", "int8", "gguf", "q8_0")
# Names only (configs are data): gpu/backends.py and kvcache/retention.py hold what they mean.
ATTENTION_BACKENDS = ("auto", "torch", "triton", "cpu", "flashinfer")


def _auto_dtype(device: str) -> str:
    if device != "cpu":
        return "bfloat16"
    from .cpu.features import cpu_info
    return "bfloat16" if cpu_info().native_bf16 else "float32"


@dataclass(frozen=True)
class RuntimeConfig:
    """How the model runs: device, activation dtype, weight format, threads."""
    device: str = "cpu"
    # activations and KV: 'float32', 'bfloat16', or 'auto' (resolved here: bfloat16 on a GPU
    # and on CPUs with native bf16 arithmetic, AVX-512-BF16 or AMX; float32 on the rest,
    # where a bf16 matmul runs several times slower than a float32 one)
    dtype: str = "auto"
    # Weights of decode-sized steps (prefill always uses the dense weights):
    #   'gguf'  the GGUF file's own blocks through the C++ kernels (mimo/cpu);
    #   'q8_0'  Q8_0 blocks made from float weights, through the same kernels;
    #   'int8'  int8 per-row copies through torch's weight-only kernel (bfloat16 only);
    #   'none'  the dense weights;
    #   'auto'  gguf for a GGUF model on a CPU whose kernels load, else int8 on CPU bfloat16.
    quantize: str = "auto"
    num_threads: int | None = None
    # torch.compile of the layers for prefill-sized steps: 'on', 'off', or 'auto' (off: on
    # this 2-core CPU the compiled layers, which break their graphs around the paged
    # attention, measured slower than eager; docs/speed.md). The default comes from
    # $MIMO_COMPILE when set.
    compile: str = field(default_factory=lambda: os.environ.get("MIMO_COMPILE", "auto"))
    # How greedy decoding finds the argmax of the LM head under int8 weights
    # (models/lm_head.py): 'exact' (the argmax of the int8 logits, proven by an error bound)
    # or 'int4' (an int4 copy scores, its best 64 are rescored exactly: a third of the head's
    # traffic for one row). 'auto': int4 when int8 weights are on. Block-quantized heads
    # (gguf, q8_0) take the argmax of their own logits in the fused kernel.
    greedy_head: str = "auto"
    # Attention kernels (mimo/gpu/backends.py): 'torch', 'triton', 'cpu', 'flashinfer' or
    # 'auto' (triton on a CUDA device when triton imports, else torch).
    attention_backend: str = "auto"
    # The padded decode step over fixed batch sizes (engine/graph_decode.py): 'on', 'off' or
    # 'auto' (on where it is captured in CUDA graphs: CUDA, a paged backend, a model whose
    # decode never reads back to the host). On CPU 'on' runs the same padded step eagerly.
    decode_graphs: str = "auto"

    def __post_init__(self):
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", _auto_dtype(self.device))
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be auto, float32 or bfloat16, not {self.dtype!r}")
        if self.quantize not in QUANTIZE:
            raise ConfigError(f"quantize must be one of {', '.join(QUANTIZE)}, "
                              f"not {self.quantize!r}")
        if self.quantize == "int8" and self.dtype != "bfloat16":
            raise ConfigError("quantize=int8 needs dtype=bfloat16 (the int8 kernel takes bf16)")
        if self.quantize in ("gguf", "q8_0") and self.device != "cpu":
            raise ConfigError(f"quantize={self.quantize} runs the CPU kernels: it needs "
                              f"device=cpu, not {self.device!r}")
        if self.greedy_head not in ("auto", "exact", "int4"):
            raise ConfigError(f"greedy_head must be auto, exact or int4, not {self.greedy_head!r}")
        if self.greedy_head == "int4" and self.quantize not in ("auto", "int8"):
            raise ConfigError("greedy_head=int4 screens the int8 head: it needs int8 weights "
                              "(quantize int8, or auto on CPU bfloat16)")
        if self.compile not in ("auto", "on", "off"):
            raise ConfigError(f"compile must be auto, on or off, not {self.compile!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                              f"not {self.attention_backend!r}")
        if self.decode_graphs not in ("auto", "on", "off"):
            raise ConfigError(f"decode_graphs must be auto, on or off, not {self.decode_graphs!r}")

    def weight_format(self, gguf_blocks: bool, kernels: bool) -> str:
        """The decode weights to use ('gguf', 'q8_0', 'int8' or 'none') for a model that
        has GGUF blocks or not, on a machine whose CPU kernels load or not."""
        q = self.quantize
        if q == "gguf" and not gguf_blocks:
            raise ConfigError("quantize=gguf needs a GGUF model (use q8_0 for others)")
        if q == "auto":
            if gguf_blocks and kernels and self.device == "cpu" and self.greedy_head != "int4":
                return "gguf"
            q = "int8" if self.dtype == "bfloat16" and self.device == "cpu" else "none"
        if self.greedy_head == "int4" and q != "int8":
            raise ConfigError(f"greedy_head=int4 screens the int8 head, and the weights "
                              f"are {q}")
        return q

    @property
    def use_compile(self) -> bool:
        return self.compile == "on"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeConfig:
        return _from_dict(cls, data)


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding. `speculative`: None (off), 'ngram' (prompt lookup: any model) or
    'mtp' (the model's multi-token-prediction layers; refused for a model without them).
    Each decoding request gets up to `num_draft_tokens` drafts per step, verified by the
    target in the same forward (mtp: clamped to the model's MTP layer count, one draft per
    layer, rather than refused, so the default works for any MTP model). The n-gram drafter
    matches the last n tokens, n from `ngram_max` down to `ngram_min`, against the request's
    earlier tokens."""
    speculative: str | None = None
    num_draft_tokens: int = 4
    ngram_max: int = 4
    ngram_min: int = 1

    def __post_init__(self):
        if self.speculative not in (None, "ngram", "mtp"):
            raise ConfigError(f"speculative must be ngram or mtp, not {self.speculative!r}")
        if isinstance(self.num_draft_tokens, bool) or not isinstance(self.num_draft_tokens, int) \
                or not 1 <= self.num_draft_tokens <= 64:
            raise ConfigError("num_draft_tokens must be an integer in [1, 64]")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("need 1 <= ngram_min <= ngram_max")

    @property
    def enabled(self) -> bool:
        return self.speculative is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecConfig:
        return _from_dict(cls, data)


@dataclass(frozen=True)
class TierConfig:
    """KV tiers below the device pools (L1): host memory (L2) and shared storage (L3).

    `host_kv_cache_memory`: bytes of host memory for pages L1 evicts (0: no L2). With
    storage and no host budget, loads from storage go straight into L1.
    `kv_storage`: 'file:DIR', 'redis://HOST:PORT[/DB]' or 'redis-cluster://HOST:PORT[,...]'
    (None: no L3). `kv_disk_cap`: byte cap of a file: store (None: unbounded).
    `kv_storage_timeout`: deadline in seconds of one storage lookup or write batch; past it
    the lookup is a miss. `kv_keepalive`: seconds between refreshes of a hot prefix's L3 keys
    (0: never), so an L3 with its own eviction keeps what L1/L2 keep hitting.
    `kv_storage_write`: 'through' (prefixes written as their prefill runs and when their
    request ends) or 'off' (read only). `kv_write_queue`: write batches waiting for
    storage; beyond it a write is dropped and counted."""
    host_kv_cache_memory: int = 0
    kv_storage: str | None = None
    kv_disk_cap: int | None = None
    kv_storage_timeout: float = 2.0
    kv_keepalive: float = 30.0
    kv_storage_write: str = "through"
    kv_write_queue: int = 64

    def __post_init__(self):
        if self.host_kv_cache_memory < 0:
            raise ConfigError("host_kv_cache_memory must be >= 0")
        if self.kv_disk_cap is not None and self.kv_disk_cap <= 0:
            raise ConfigError("kv_disk_cap must be positive")
        if not self.kv_storage_timeout > 0:
            raise ConfigError("kv_storage_timeout must be > 0 seconds")
        if self.kv_keepalive < 0:
            raise ConfigError("kv_keepalive must be >= 0 seconds (0: off)")
        if self.kv_storage_write not in ("through", "off"):
            raise ConfigError("kv_storage_write must be 'through' or 'off'")
        if self.kv_write_queue < 1:
            raise ConfigError("kv_write_queue must be >= 1")
        if self.kv_storage is not None and not self.kv_storage.startswith(
                ("file:", "redis://", "rediss://", "redis-cluster://")):
            raise ConfigError(f"kv_storage {self.kv_storage!r}: use file:DIR, "
                              "redis://HOST:PORT or redis-cluster://HOST:PORT[,HOST:PORT...]")

    @property
    def enabled(self) -> bool:
        return self.host_kv_cache_memory > 0 or self.kv_storage is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TierConfig:
        data = dict(data)
        for k in ("host_kv_cache_memory", "kv_disk_cap"):
            if data.get(k) is not None:
                data[k] = parse_size(data[k])
        return _from_dict(cls, data)


@dataclass(frozen=True)
class EngineConfig:
    model: str = "gemma-3-270m"
    max_model_len: int | None = None
    seed: int = 0
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    tiers: TierConfig = field(default_factory=TierConfig)


def check_responses_store(url: str | None) -> None:
    """ConfigError unless `url` names a responses store: memory:// (None: the same) or
    redis://HOST[:PORT][/DB] (rediss:// with TLS)."""
    if url is None or url == "memory://":
        return
    from urllib.parse import urlparse
    u = urlparse(url)
    if u.scheme not in ("redis", "rediss") or not u.hostname:
        raise ConfigError(f"responses store must be memory:// or redis://HOST:PORT[/DB] "
                          f"(or rediss://), got {url!r}")
    try:
        _ = u.port
    except ValueError:
        raise ConfigError(f"responses store URL has a bad port: {url!r}") from None


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP front: where it listens, who may call it, how much it accepts."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None     # default: the --model value
    max_body_bytes: int = 8 * 2**20
    max_in_flight: int = 256                 # requests inside the pipeline at once
    max_queued: int = 1024                   # beyond max_in_flight; more get HTTP 503
    embed_cache_bytes: int = 512 * 2**20     # vision-encoder outputs kept by media content
    # 1: the vision encoder runs in the server process; N > 1: N encoder processes, each
    # with its own embedding cache of embed_cache_bytes, media routed by the hash ring.
    encoder_workers: int = 1
    # ---- API
    body_read_timeout: float = 30.0          # seconds to receive a whole body (else 408)
    metrics_public: bool = False             # /metrics without the API key
    default_max_tokens: int | None = None    # max_tokens when a request sends none (None: the rest)
    # ---- router: publish cache state and load for `python -m mimo.router`
    router_redis: str | None = None          # redis://... or redis-cluster://...; None: off
    advertise_url: str | None = None         # this server as routers reach it (default: host:port)
    router_heartbeat: float = 0.5            # seconds between heartbeats (TTL: 6 of them)
    # ---- /v1/responses: where finished responses are kept for previous_response_id
    responses_store: str | None = None       # None / memory://: this process; redis://...: shared
    responses_ttl: float = 86400.0           # seconds a stored response lives
    web_ui: bool = True                      # the chat page at / (api/web_ui.py)
    # ---- disaggregated serving (mimo/disagg): both, prefill or decode
    role: str = "both"
    kv_transfer_timeout: float = 60.0        # decode role: longest silence of a KV stream (s)

    def __post_init__(self):
        if not self.body_read_timeout > 0:
            raise ConfigError("body_read_timeout must be > 0")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ConfigError("default_max_tokens must be >= 1")
        if not 0 <= self.port < 65536:
            raise ConfigError("port must be in [0, 65535]")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be >= 1024")
        if self.max_in_flight < 1 or self.max_queued < 0:
            raise ConfigError("max_in_flight must be >= 1 and max_queued >= 0")
        if self.embed_cache_bytes < 0:
            raise ConfigError("embed_cache_bytes must be >= 0")
        if self.encoder_workers < 1:
            raise ConfigError(f"encoder_workers must be >= 1, not {self.encoder_workers}")
        if not self.router_heartbeat > 0:
            raise ConfigError("router_heartbeat must be > 0")
        if not self.responses_ttl >= 1:
            raise ConfigError("responses_ttl must be >= 1 second")
        check_responses_store(self.responses_store)
        if self.role not in ("both", "prefill", "decode"):
            raise ConfigError(f"role must be both, prefill or decode, not {self.role!r}")
        if not self.kv_transfer_timeout > 0:
            raise ConfigError("kv_transfer_timeout must be > 0")
