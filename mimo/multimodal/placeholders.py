"""Placing media in a tokenized prompt: each item's one pad token becomes as many pad tokens
as the encoder gives it embedding rows (as Hugging Face's processors expand them), and the
engine's `MMPrompt` is built over the expanded ids.

The prompt's `cache_key` hashes the items' keys in prompt order: the prefix cache then
shares KV only between prompts with the same media in the same places (placeholder ids
alone are identical for any picture).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch

from .adapter import VisionAdapter
from .mm_prompt import MMPrompt
from .preprocessed import PreprocessedMedia


class PlaceholderMismatch(ValueError):
    """The prompt's media placeholders and the request's media items do not pair up (a
    client fault: e.g. placeholder tokens typed in the text)."""


def expand_placeholders(ids: Sequence[int], pads: Mapping[int, str], kinds: Sequence[str],
                        counts: Sequence[int]) -> list[int]:
    """Replace the k-th pad token (`pads`: token id -> the kind it stands for) by counts[k]
    copies; kinds[k] must be its kind."""
    out: list[int] = []
    k = 0
    for tok in ids:
        kind = pads.get(tok)
        if kind is None:
            out.append(tok)
            continue
        if k >= len(kinds) or kinds[k] != kind:
            got = "nothing" if k >= len(kinds) else f"a {kinds[k]}"
            raise PlaceholderMismatch(
                f"the prompt's media placeholder {k + 1} is for a {kind}, but the request's "
                f"media item {k + 1} is {got} (media placeholder tokens in the text are not "
                f"allowed)")
        out.extend([tok] * counts[k])
        k += 1
    if k != len(kinds):
        raise PlaceholderMismatch(f"the prompt has {k} media placeholders for {len(kinds)} "
                                  f"media items")
    return out


def media_cache_key(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def pad_kinds(adapter: VisionAdapter) -> dict[int, str]:
    return {adapter.pad_token(k): k for k in adapter.kinds}


def place_media(ids: Sequence[int], adapter: VisionAdapter, media: Sequence[PreprocessedMedia],
                embeds: Sequence[torch.Tensor]) -> tuple[list[int], MMPrompt | None]:
    """(expanded ids, MMPrompt) for a prompt with one pad token per item of `media`, whose
    encoder output is `embeds` (both in prompt order); (ids, None) without media."""
    pads = pad_kinds(adapter)
    counts = [adapter.tokens_per_item(m.patches.grid_thw) for m in media]
    full = expand_placeholders(ids, pads, [m.kind for m in media], counts)
    if not media:
        return full, None
    positions, delta = adapter.rope_index(full, media)
    by_token: dict[int, list[torch.Tensor]] = {}
    for m, e in zip(media, embeds):
        by_token.setdefault(adapter.pad_token(m.kind), []).append(e)
    mmp = MMPrompt.assemble(full, positions, delta, by_token)
    mmp.cache_key = media_cache_key([m.key for m in media])
    return full, mmp
