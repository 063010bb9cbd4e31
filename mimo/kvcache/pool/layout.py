"""KV layout of a model: which layers store what, and how the byte budget becomes pages.

Kept free of any model code: the bench and the scheduler size pools from shapes alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config import CacheConfig, ConfigError, ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class LayerKV:
    """One attention layer's KV row: heads x (k_dim + v_dim) elements per token."""
    kv_heads: int
    k_dim: int
    v_dim: int

    @property
    def elems(self) -> int:
        return self.kv_heads * (self.k_dim + self.v_dim)


@dataclass(frozen=True)
class KVLayout:
    """Per-pool layer lists. In the 'hybrid' layout SWA layers live in the SWA pool and keep
    only their window; in 'full-kv' (the pre-SWA baseline) every layer is in the full pool."""
    full: tuple[LayerKV, ...]
    swa: tuple[LayerKV, ...]
    window: int            # keys an SWA query sees, itself included
    dtype_bytes: int
    hybrid: bool = True

    @property
    def full_bytes_per_token(self) -> int:
        return sum(lay.elems for lay in self.full) * self.dtype_bytes

    @property
    def swa_bytes_per_token(self) -> int:
        return sum(lay.elems for lay in self.swa) * self.dtype_bytes

    @property
    def swa_receptive_field(self) -> int:
        """Tokens before a position that its SWA KV depends on through the chain of SWA
        layers (each sees window - 1 earlier tokens; full layers read cached keys, so they
        add none when those are cached): what a window rebuild recomputes."""
        return len(self.swa) * (self.window - 1) if self.hybrid else 0

    def request_bytes(self, context: int, page_size: int) -> int:
        """Bytes one request of `context` tokens holds once its window is released."""
        full = self.full_bytes_per_token * context
        if not self.swa:
            return full
        return full + self.swa_bytes_per_token * min(context, self.window + page_size)

    @classmethod
    def from_model(cls, cfg: ModelConfig, dtype: str, layout: str = "hybrid") -> KVLayout:
        kinds = cfg.kv_layer_types          # MTP layers count as SWA layers
        full = [LayerKV(*cfg.kv_shape("full")) for t in kinds if t == "full"]
        swa = [LayerKV(*cfg.kv_shape("swa")) for t in kinds if t == "swa"]
        if layout == "full-kv" or not swa:
            return cls(tuple(LayerKV(*cfg.kv_shape(t)) for t in kinds), (),
                       cfg.sliding_window, DTYPE_BYTES[dtype], hybrid=False)
        return cls(tuple(full), tuple(swa), cfg.sliding_window, DTYPE_BYTES[dtype])


# Shapes of real models, for sizing and benchmarks without weights. (Entries mix ints and
# tuples and `shape_layout` reads them by computed keys, hence Any.)
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "gemma-3-270m": dict(layers=18, full_every=6, full=(1, 256, 256), swa=(1, 256, 256), window=512),
    "gemma-3-1b": dict(layers=26, full_every=6, full=(1, 256, 256), swa=(1, 256, 256), window=512),
    # 48 layers: 9 full-attention, 39 SWA (W=128); 4 KV heads on full layers, 8 on SWA layers.
    "mimo-v2-flash": dict(layers=48, full_ids=(0, 5, 11, 17, 23, 29, 35, 41, 47),
                          full=(4, 192, 128), swa=(8, 192, 128), window=128),
}


def shape_layout(name: str, dtype: str = "bfloat16", layout: str = "hybrid") -> KVLayout:
    if name not in KNOWN_SHAPES:
        raise ConfigError(f"unknown shape {name!r}; known: {', '.join(sorted(KNOWN_SHAPES))}")
    s = KNOWN_SHAPES[name]
    if "full_ids" in s:
        kinds = ["full" if i in s["full_ids"] else "swa" for i in range(s["layers"])]
    else:
        kinds = ["full" if (i + 1) % s["full_every"] == 0 else "swa" for i in range(s["layers"])]
    full = [LayerKV(*s["full"]) for k in kinds if k == "full"]
    swa = [LayerKV(*s["swa"]) for k in kinds if k == "swa"]
    if layout == "full-kv":
        return KVLayout(tuple(LayerKV(*s[k]) for k in kinds), (), s["window"],
                        DTYPE_BYTES[dtype], hybrid=False)
    return KVLayout(tuple(full), tuple(swa), s["window"], DTYPE_BYTES[dtype])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def swa_steady_pages(window: int, page: int, context: int) -> int:
    """SWA pages a request holds between steps once its window is released: positions
    (len - window, len] span at most cdiv(window, page) + 1 pages."""
    return min(_cdiv(context, page), _cdiv(window, page) + 1)


def swa_transient_pages(chunk: int, page: int) -> int:
    """Extra SWA pages a prefill chunk of `chunk` tokens needs during its step (released at
    its end): the chunk's own pages plus one for a page boundary."""
    return _cdiv(chunk, page) + 1 if chunk else 0


def plan_pages(layout: KVLayout, cache: CacheConfig, context: int, chunk: int = 0
               ) -> tuple[int, int]:
    """Split the byte budget into (full_pages, swa_pages).

    With an explicit `swa_share`, that fraction of the whole budget goes to the SWA pool.
    Otherwise the SWA pool first gets the transient pages of one prefill chunk of `chunk`
    tokens (the scheduler's step budget) and the rest is split so that both pools run out
    together for requests of `context` tokens (each holding cdiv(context, page)
    full pages and `swa_steady_pages` SWA pages), so neither pool is exhausted while the other
    still has room.
    """
    budget, page = cache.kv_cache_memory, cache.page_size
    fb, sb = layout.full_bytes_per_token * page, layout.swa_bytes_per_token * page
    if not layout.swa:
        return budget // fb, 0
    if cache.swa_share is not None:
        # An explicit share is of the whole budget; the operator owns the transient headroom.
        swa_pages = int(budget * cache.swa_share) // sb
        full_pages = int(budget * (1 - cache.swa_share)) // fb
    else:
        extra = swa_transient_pages(chunk, page)
        rest = budget - extra * sb
        f, w = _cdiv(context, page), swa_steady_pages(layout.window, page, context)
        share = w * sb / (f * fb + w * sb)
        # Nearest whole page on the SWA side (never below one request's window), the rest to
        # the full pool, so the total never exceeds the budget.
        steady = max(round(rest * share / sb), min(w, rest // sb)) if rest > 0 else 0
        if steady < 1:
            # The chunk's transient pages alone would fill the SWA pool: no request could
            # keep its window between steps.
            raise ConfigError(
                f"kv_cache_memory={budget} bytes is too small: the SWA pool needs {extra} "
                f"pages for one prefill chunk of {chunk} tokens and at least one more")
        swa_pages = extra + steady
        full_pages = (budget - swa_pages * sb) // fb
    if full_pages < 1 or swa_pages < 1:
        raise ConfigError(f"kv_cache_memory={budget} bytes is too small for one page per pool")
    return full_pages, swa_pages
