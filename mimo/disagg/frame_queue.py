"""FrameQueue: the hand-over of one request's KV frames from the engine thread to the event
loop that writes them to the socket.

The engine thread `put`s frames (`kvcache.kv_frames.KVFrame`, host copies it owns no more)
and never waits; the loop `get`s them in order. The loop also puts the stream's end: `End`
(the request finished: first token and cache hits, read from the request's own stream,
whose last event the engine emits only after its last frame went in) or `Failed`. `close`
drops whatever is still queued and makes later `put`s no-ops, so a transfer that stops
(client gone, request failed) frees its host buffers at once, and a frame the engine makes
after that is dropped by the engine thread itself. `queued_bytes` is what it holds now.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass

from ..kvcache.kv_frames import KVFrame


@dataclass(frozen=True)
class End:
    first_token: int
    cached_tokens: int


@dataclass(frozen=True)
class Failed:
    reason: str


Item = KVFrame | End | Failed


class FrameQueue:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._items: deque[Item] = deque()
        self._closed = False
        self._wake = asyncio.Event()        # loop side only (set through the loop)
        self.queued_bytes = 0
        self.frames_in = 0                  # frames ever accepted

    def put(self, frame: KVFrame) -> bool:
        """Any thread (the engine's): queue `frame`; False once closed (frame dropped)."""
        return self._add(frame, frame.nbytes)

    def end(self, item: End | Failed) -> None:
        """The loop: queue the stream's end after every frame already in."""
        self._add(item, 0)

    def _add(self, item: Item, nbytes: int) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._items.append(item)
            self.queued_bytes += nbytes
            self.frames_in += isinstance(item, KVFrame)
        self._loop.call_soon_threadsafe(self._wake.set)
        return True

    async def get(self) -> Item:
        """The loop: the next item, waiting for it; `Failed` once closed."""
        while True:
            with self._lock:
                if self._items:
                    item = self._items.popleft()
                    if isinstance(item, KVFrame):
                        self.queued_bytes -= item.nbytes
                    return item
                if self._closed:
                    return Failed("closed")
                # cleared under the lock: a put after this sets it again through the loop
                self._wake.clear()
            await self._wake.wait()

    def close(self) -> None:
        """Drop everything queued; later puts are refused (idempotent, any thread)."""
        with self._lock:
            self._closed = True
            self._items.clear()
            self.queued_bytes = 0
        self._loop.call_soon_threadsafe(self._wake.set)
