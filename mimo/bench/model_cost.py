"""What a decoder must at least read and compute per token, from its ModelConfig alone: the
machine-limit side of `bench peers` and `bench flash-shape`.

Counted (each a lower bound, so a measured rate over the bound it implies is a fraction <= 1):
- matmul parameters a token passes through, per layer: q, k, v, o projections
  (heads x qk_dim, kv_heads x qk_dim, kv_heads x v_dim, heads x v_dim, each x hidden); a dense
  MLP's gate, up and down (3 x hidden x intermediate); a sparse (MoE) layer's router
  (hidden x experts) plus its top-k experts (k x 3 x hidden x moe_intermediate). The LM head
  is vocab x hidden (tied to the embedding or not: it is read either way); the embedding
  lookup reads one row and is left out, as are norms and biases (under 0.1 %).
- FLOPs per token: 2 per matmul parameter, plus attention: 2 x heads x (qk_dim + v_dim) per
  key attended, a query at position p attending p + 1 keys on a full layer and
  min(p + 1, window) on an SWA layer. Prefill computes the LM head for the last prompt token
  only (every server here does), decode for every token.
- bytes per decode step of B streams: every dense weight once, the experts a batch touches
  (B tokens routed uniformly to k of E experts touch E x (1 - (1 - k/E)^B) of them, the
  expectation), times `weight_bytes` per parameter; plus each stream's KV read: per layer
  keys x kv_heads x (qk_dim + v_dim) x `kv_bytes`.

`weight_bytes` is the reference format of the bound, not what a server stores: 1.0 (int8, the
format a 250 tok/s bound is sized on) unless asked. A server that reads fewer bytes
per weight (llama.cpp's Q4_K_M) can then show a memory fraction above what it really uses.

A roofline time is max(bytes / bandwidth, FLOPs / matmul rate): whichever limit binds. A
fraction above 1 is possible: the matmul rate is a bf16 one, and int8 arithmetic (llama.cpp's
quantized dot products, int8 weights) can beat it; a machine busy while its limits were
measured also gives limits too low.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig


@dataclass(frozen=True)
class Limits:
    """The machine's measured rates: bytes/s read from memory, FLOP/s of a prefill matmul."""
    bandwidth: float
    matmul_flops: float


@dataclass(frozen=True)
class ModelCost:
    cfg: ModelConfig
    weight_bytes: float = 1.0      # bytes per weight parameter in the bound's reference format
    kv_bytes: float = 2.0          # bytes per cached K/V element (bf16)

    # ---- parameter counts
    def _kind(self, layer: int) -> tuple[int, int, int, int]:
        """(heads, kv_heads, qk_dim, v_dim) of a layer."""
        kv, qk, v = self.cfg.kv_shape(self.cfg.layer_types[layer])
        return self.cfg.num_heads, kv, qk, v

    def attention_params(self, layer: int) -> int:
        h, kv, qk, v = self._kind(layer)
        return self.cfg.hidden_size * (h * qk + kv * qk + kv * v + h * v)

    def _sparse(self, layer: int) -> bool:
        return bool(self.cfg.mlp_types) and self.cfg.mlp_types[layer] == "sparse"

    def expert_params(self) -> int:
        return 3 * self.cfg.hidden_size * self.cfg.moe_intermediate_size

    def dense_mlp_params(self, layer: int) -> int:
        """The MLP weights every token reads on a layer (a sparse layer: its router)."""
        if self._sparse(layer):
            return self.cfg.hidden_size * self.cfg.num_experts
        return 3 * self.cfg.hidden_size * self.cfg.intermediate_size

    def lm_head_params(self) -> int:
        return self.cfg.vocab_size * self.cfg.hidden_size

    def active_params(self) -> int:
        """Matmul parameters one token passes through in the decoder layers (no LM head)."""
        n = 0
        for i in range(self.cfg.num_layers):
            n += self.attention_params(i) + self.dense_mlp_params(i)
            if self._sparse(i):
                n += self.cfg.num_experts_per_tok * self.expert_params()
        return n

    def touched_params(self, tokens: float) -> float:
        """Weight parameters a step over `tokens` tokens reads (the LM head included)."""
        n = float(self.lm_head_params())
        for i in range(self.cfg.num_layers):
            n += self.attention_params(i) + self.dense_mlp_params(i)
            if self._sparse(i):
                e, k = self.cfg.num_experts, self.cfg.num_experts_per_tok
                n += e * (1.0 - (1.0 - k / e) ** tokens) * self.expert_params()
        return n

    # ---- per position
    def _keys(self, layer: int, pos: int) -> int:
        if self.cfg.layer_types[layer] == "swa":
            return min(pos + 1, self.cfg.sliding_window)
        return pos + 1

    def attention_flops(self, pos: int) -> float:
        f = 0.0
        for i in range(self.cfg.num_layers):
            h, _, qk, v = self._kind(i)
            f += 2.0 * h * (qk + v) * self._keys(i, pos)
        return f

    def kv_read_bytes(self, pos: int) -> float:
        b = 0.0
        for i in range(self.cfg.num_layers):
            _, kv, qk, v = self._kind(i)
            b += self._keys(i, pos) * kv * (qk + v) * self.kv_bytes
        return b

    # ---- work of a step
    def decode_flops(self, pos: int) -> float:
        """One decode token at position `pos` (its logits computed)."""
        return 2.0 * (self.active_params() + self.lm_head_params()) + self.attention_flops(pos)

    def prefill_flops(self, start: int, end: int) -> float:
        """Prompt positions [start, end) computed (start: tokens already cached), the LM head
        for the last one only."""
        attn = sum(self.attention_flops(p) for p in range(start, end))
        return 2.0 * self.active_params() * (end - start) + attn + 2.0 * self.lm_head_params()

    def decode_step_bytes(self, positions: list[int]) -> float:
        """A decode step of one token per stream, at these positions."""
        weights = self.touched_params(len(positions)) * self.weight_bytes
        return weights + sum(self.kv_read_bytes(p) for p in positions)

    def prefill_bytes(self, start: int, end: int) -> float:
        """Weights read at least once by a prefill of positions [start, end)."""
        return self.touched_params(max(1, end - start)) * self.weight_bytes

    # ---- roofline times (seconds)
    def decode_step_time(self, positions: list[int], lim: Limits) -> dict:
        mem = self.decode_step_bytes(positions) / lim.bandwidth
        comp = sum(self.decode_flops(p) for p in positions) / lim.matmul_flops
        return {"memory_s": mem, "compute_s": comp, "bound_s": max(mem, comp)}

    def prefill_time(self, start: int, end: int, lim: Limits) -> dict:
        mem = self.prefill_bytes(start, end) / lim.bandwidth
        comp = self.prefill_flops(start, end) / lim.matmul_flops
        return {"memory_s": mem, "compute_s": comp, "bound_s": max(mem, comp)}

    def summary(self) -> dict:
        """The counts the JSON line reports beside the fractions."""
        return {"active_params": self.active_params(), "lm_head_params": self.lm_head_params(),
                "decode_flops_at_0": self.decode_flops(0),
                "decode_bytes_1_stream_at_0": self.decode_step_bytes([0]),
                "weight_bytes_per_param": self.weight_bytes, "kv_bytes": self.kv_bytes}
