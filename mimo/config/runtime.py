"""How the engine runs: the KV cache, the scheduler, device / dtype / weight format."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .base import ConfigError, _from_dict, parse_size

# The prefix cache's SWA retention policies (kvcache/radix/retention.py: POLICIES, same keys).
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
    prefix_cache: bool = True           # the SWA-aware prefix cache (kvcache/radix/cache.py)
    retention: str = "hybrid-output"   # SWA retention policy of the prefix cache (kvcache/radix/retention.py)
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
    """Continuous batching: at most `max_num_seqs` running requests; each step gives every
    decoding request its token, then schedules at most `max_num_batched_tokens` tokens of
    prefill chunks and speculative drafts (the decodes' own tokens come on top); while any
    request is decoding, at most `max_mixed_batched_tokens` (the decodes wait for the step).
    A prefill chunk of `mixed_step_tokens` always fits the SWA pool's reservation; a larger
    one (a step with nobody decoding) takes pages only where they are free.

    `policy` orders the waiting queue: 'fcfs', or 'compute-aware' (fewest uncached prompt
    tokens first; a request's priority improves by `aging_per_second` tokens per second of
    waiting, so its wait is bounded by uncached/aging_per_second plus the work ahead of it).
    `length_buckets`: prompt-length cut points; one prefill batch takes one bucket only."""
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1536
    max_mixed_batched_tokens: int = 512
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
        if self.max_mixed_batched_tokens < 1:
            raise ConfigError("max_mixed_batched_tokens must be >= 1")
        if self.policy not in ("fcfs", "compute-aware"):
            raise ConfigError(f"policy must be fcfs or compute-aware, not {self.policy!r}")
        if not self.aging_per_second > 0:
            raise ConfigError("aging_per_second must be > 0 (0 would let requests starve)")
        if self.length_buckets is not None:
            b = list(self.length_buckets)
            if not b or any(x <= 0 for x in b) or b != sorted(set(b)):
                raise ConfigError("length_buckets must be increasing positive token counts")

    @property
    def mixed_step_tokens(self) -> int:
        """Prefill and draft tokens of a step while requests decode; the chunk the SWA
        pool's reservation always has room for."""
        return min(self.max_num_batched_tokens, self.max_mixed_batched_tokens)

    def step_tokens(self, decoding: bool) -> int:
        """This step's budget of prefill and draft tokens."""
        return self.mixed_step_tokens if decoding else self.max_num_batched_tokens

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SchedulerConfig:
        return _from_dict(cls, data)


QUANTIZE = ("auto", "none", "int8", "gguf", "q8_0")
PREFILL_MATMULS = ("auto", "dense", "blocks")
# Names only (configs are data): gpu/backends.py and kvcache/radix/retention.py hold what they mean.
ATTENTION_BACKENDS = ("auto", "torch", "triton", "cpu", "flashinfer")


def _auto_dtype(device: str) -> str:
    if device != "cpu":
        return "bfloat16"
    from ..cpu.features import cpu_info
    return "bfloat16" if cpu_info().native_bf16 else "float32"


@dataclass(frozen=True)
class RuntimeConfig:
    """How the model runs: device, activation dtype, weight format, threads."""
    device: str = "cpu"
    # activations and KV: 'float32', 'bfloat16', or 'auto' (resolved here: bfloat16 on a GPU
    # and on CPUs with native bf16 arithmetic, AVX-512-BF16 or AMX; float32 on the rest,
    # where a bf16 matmul runs several times slower than a float32 one)
    dtype: str = "auto"
    # Weights of decode-sized steps (prefill: see prefill_matmul below):
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
    # Decode steps with gguf or q8_0 weights run each decoder layer as one C++ call
    # (models/fused_decode.py): 'auto' (on where the CPU kernels load and the layer is of a
    # shape they run) or 'off' (the plain PyTorch layers, the reference).
    fused_decode: str = "auto"
    # Weights of prefill-sized steps (more than 16 rows) with gguf or q8_0 weights: 'dense'
    # (torch's GEMM on the dense copy in `dtype`, the reference), 'blocks' (the blocks' C++
    # int8 GEMM; opt-in, and refused under compile=on, whose graphs trace the dense GEMM) or
    # 'auto' (dense: engine/prefill_matmul.py says why).
    prefill_matmul: str = "auto"
    # gguf and q8_0 weights in the layout the kernel build multiplies fastest: 'auto' (the types
    # cpu/qmatrix.py's repack_types names for the build repacked 8 rows a tile, cpu/csrc/
    # qrepack.h; the same values) or 'off' (the GGUF's blocks as stored).
    repack: str = "auto"

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
        if self.fused_decode not in ("auto", "off"):
            raise ConfigError(f"fused_decode must be auto or off, not {self.fused_decode!r}")
        if self.repack not in ("auto", "off"):
            raise ConfigError(f"repack must be auto or off, not {self.repack!r}")
        if self.prefill_matmul not in PREFILL_MATMULS:
            raise ConfigError(f"prefill_matmul must be one of {', '.join(PREFILL_MATMULS)}, "
                              f"not {self.prefill_matmul!r}")
        if self.prefill_matmul == "blocks" and self.compile == "on":
            raise ConfigError("prefill_matmul=blocks runs a C++ GEMM that compiled layers "
                              "(compile=on) do not trace: use one or the other")

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
