"""fetch: the bytes of every media item of a request (req.media -> req.fetched),
concurrently.

Items of one request and of different requests download at the same time; `max_fetches`
bounds open downloads across all requests (sockets and buffered bytes).
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..multimodal.address import Resolver, system_resolver
from ..multimodal.config import MediaConfig
from ..multimodal.fetch import fetch
from ..pipeline import Stage
from .chat_request import ChatRequest
from .media_items import gather_items

if TYPE_CHECKING:
    import httpx


class Fetch(Stage):
    name = "fetch"

    def __init__(self, cfg: MediaConfig | None = None, *, max_fetches: int = 64,
                 resolver: Resolver = system_resolver,
                 transport: httpx.AsyncBaseTransport | None = None):
        super().__init__()
        self.cfg = cfg or MediaConfig()
        self.max_fetches = max_fetches
        self.resolver = resolver
        self.transport = transport
        self._downloads: asyncio.Semaphore | None = None   # made on the running loop

    async def process(self, req: ChatRequest) -> None:
        if self._downloads is None:
            self._downloads = asyncio.Semaphore(self.max_fetches)
        downloads = self._downloads

        async def one(i, it):
            async with downloads:
                return await fetch(it.url, self.cfg, resolver=self.resolver,
                                   transport=self.transport)
        req.fetched = await gather_items(req.media, one)
