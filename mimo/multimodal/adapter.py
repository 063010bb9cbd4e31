"""VisionAdapter: what one vision-language family means by an image or a video, and the
registry that finds the adapter for a model.

Everything family-specific on the serving path is asked of the adapter: the text a chat
template sees for a media part, the pad token each item's embedding rows replace, how many
rows an item yields, the processor settings, the rope positions of a prompt with media, and
the vision tower. The api, stages and engine know no family; a new one is one subclass,
registered under its `ModelConfig.arch`:

    @register_adapter
    class MyVLAdapter(VisionAdapter):
        arch = "my_vl"
        ...

Invariant the prompt builder relies on: each media item is one `pad_token(kind)` in the
tokenized prompt, expanded to `tokens_per_item(grid)` copies, and the encoder returns that
many embedding rows for the item.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from ..config import ModelConfig
    from .config import MediaConfig
    from .preprocess import ProcessorSettings
    from .preprocessed import PreprocessedMedia

Encoder = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]

_ADAPTERS: dict[str, type[VisionAdapter]] = {}


class UnknownVisionFamily(LookupError):
    """A model with a vision tower whose architecture has no registered adapter."""


class VisionAdapter(ABC):
    """One vision-language family, bound to one model's config (`config.vision` set)."""
    arch: ClassVar[str]                 # the ModelConfig.arch it serves
    kinds: ClassVar[tuple[str, ...]] = ("image", "video")

    def __init__(self, config: ModelConfig):
        if config.vision is None:
            raise ValueError(f"model {config.arch!r} has no vision tower")
        self.config = config
        self.vision = config.vision

    # ---- the prompt -------------------------------------------------------------------
    @abstractmethod
    def placeholder_text(self, tokenizer, kind: str) -> str:
        """What the prompt holds for one media part before the chat template runs (the
        template takes string contents): exactly one `pad_token(kind)` among its tokens."""

    @abstractmethod
    def pad_token(self, kind: str) -> int:
        """The token id whose embedding rows an item of `kind` replaces."""

    def tokens_per_item(self, grid_thw: Sequence[int]) -> int:
        """Embedding rows (and prompt tokens) one item with this patch grid yields."""
        t, h, w = (int(x) for x in grid_thw)
        return t * h * w // self.merge ** 2

    @abstractmethod
    def rope_index(self, prompt_ids: Sequence[int], media: Sequence[PreprocessedMedia]
                   ) -> tuple[torch.Tensor, int]:
        """Positions of the expanded prompt ([axes, len(prompt_ids)], int64) and the decode
        offset `delta`: generated token i >= len(prompt_ids) sits at i + delta. `media` is
        in prompt order."""

    # ---- preprocessing ----------------------------------------------------------------
    @abstractmethod
    def processor_settings(self, media: MediaConfig) -> ProcessorSettings:
        """The checkpoint's preprocessing, with the server's media limits applied."""

    @property
    def patch_dim(self) -> int:
        return self.vision.patch_dim

    @property
    def merge(self) -> int:
        """Side of the square of patches one embedding row merges (1: no merger)."""
        return self.vision.spatial_merge_size

    # ---- the tower ----------------------------------------------------------------------
    @abstractmethod
    def build_tower(self, weights: dict, dtype: torch.dtype) -> torch.nn.Module:
        """The vision tower alone from a checkpoint's weights (encoder worker processes
        load one each): `tower(pixel_values, grid_thw)` -> rows of every item, in order."""

    def encoder(self, model) -> Encoder:
        """The in-process encoder of a built model (default: its `encode`, which shares
        the model's tower weights)."""
        return model.encode


def register_adapter(cls: type[VisionAdapter]) -> type[VisionAdapter]:
    """Class decorator: serve models whose `ModelConfig.arch` is `cls.arch` with `cls`."""
    arch = cls.__dict__.get("arch")
    if not isinstance(arch, str) or not arch:
        raise TypeError(f"{cls.__name__} needs a class attribute arch = '<model arch>'")
    _ADAPTERS[arch] = cls
    return cls


def adapter_for(config: ModelConfig) -> VisionAdapter | None:
    """The adapter for a model, or None for a text-only one (no vision tower)."""
    if config.vision is None:
        return None
    from . import adapters  # noqa: F401 - the built-in families register on import
    cls = _ADAPTERS.get(config.arch)
    if cls is None:
        raise UnknownVisionFamily(
            f"model architecture {config.arch!r} has a vision tower but no vision adapter "
            f"(registered: {', '.join(sorted(_ADAPTERS)) or 'none'})")
    return cls(config)
