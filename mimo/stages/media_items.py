"""Run one coroutine per media item of a request, concurrently; the first failure cancels
the rest (their work is wasted once the request fails) and a MediaError becomes an
InvalidRequest (HTTP 400) that names the item."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

from ..multimodal.errors import MediaError
from ..multimodal.item import MediaItem
from ..pipeline import InvalidRequest


def request_items(data: dict) -> list[MediaItem]:
    items = data.get("media") or []
    for it in items:
        if not isinstance(it, MediaItem):
            raise TypeError(f"req.data['media'] must hold MediaItem, not {type(it).__name__}")
    return list(items)


async def gather_items(items: Sequence[MediaItem],
                       fn: Callable[[int, MediaItem], Awaitable[Any]]) -> list[Any]:
    async def one(i: int, it: MediaItem):
        try:
            return await fn(i, it)
        except MediaError as e:
            raise InvalidRequest(f"{it.kind} {i + 1} of {len(items)}: {e}") from e

    tasks = [asyncio.ensure_future(one(i, it)) for i, it in enumerate(items)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        # Reap them, so no "exception was never retrieved" and no task outlives the call.
        await asyncio.gather(*tasks, return_exceptions=True)
