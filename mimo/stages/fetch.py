"""fetch: the bytes of every media item of a request (req.data['media']), concurrently.

Items of one request and of different requests download at the same time; `max_fetches`
bounds open downloads across all requests (sockets and buffered bytes). Returns a list of
bytes in item order.
"""
from __future__ import annotations

import asyncio

import httpx

from ..multimodal.address import Resolver, system_resolver
from ..multimodal.config import MediaConfig
from ..multimodal.fetch import fetch
from ..pipeline import Stage
from .media_items import gather_items, request_items


class Fetch(Stage):
    name = "fetch"

    def __init__(self, cfg: MediaConfig = MediaConfig(), *, max_fetches: int = 64,
                 resolver: Resolver = system_resolver,
                 transport: httpx.AsyncBaseTransport | None = None):
        super().__init__()
        self.cfg = cfg
        self.max_fetches = max_fetches
        self.resolver = resolver
        self.transport = transport
        self._downloads: asyncio.Semaphore | None = None   # made on the running loop

    async def process(self, req):
        items = request_items(req.data)
        if self._downloads is None:
            self._downloads = asyncio.Semaphore(self.max_fetches)

        async def one(i, it):
            async with self._downloads:
                return await fetch(it.url, self.cfg, resolver=self.resolver,
                                   transport=self.transport)
        return await gather_items(items, one)
