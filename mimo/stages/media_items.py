"""Run one coroutine per media item of a request, concurrently; the first failure cancels
the rest (their work is wasted once the request fails). A MediaError keeps its type and
gains which item it is about ("image 2 of 3: ..."); mapping it to HTTP is the API's job."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..multimodal.errors import MediaError
from ..multimodal.item import MediaItem


async def gather_items(items: Sequence[MediaItem],
                       fn: Callable[[int, MediaItem], Awaitable[Any]]) -> list[Any]:
    async def one(i: int, it: MediaItem):
        try:
            return await fn(i, it)
        except MediaError as e:
            # Same type (one argument: these errors pickle), the item named for the client.
            raise type(e)(f"{it.kind} {i + 1} of {len(items)}: {e}") from e

    tasks = [asyncio.ensure_future(one(i, it)) for i, it in enumerate(items)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        # Reap them, so no "exception was never retrieved" and no task outlives the call.
        await asyncio.gather(*tasks, return_exceptions=True)
