"""KVSender: the prefill worker's answer to one KV request, an ASGI response that writes the
stream (`wire`) while the engine computes it.

The header goes out at once; then each frame as the engine thread hands it over
(`FrameQueue`), so the first frames are on the socket while later chunks and layers are
still being computed; the trailer (first token, cache hits) once the request's own stream
says the prompt is done and every frame has gone. Everything runs on the event loop: the
engine thread only fills the queue.

Whatever stops it early (the request failed in the engine, the client went away, a send
failed) ends the stream short, which the decode worker takes as a failed transfer and
recomputes, and releases everything: the request is aborted in the engine (its pages go
back to the pool), the queue is closed (queued host copies dropped, later frames refused).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from ..engine.async_engine import AsyncEngine, RequestStream
from .frame_queue import End, Failed, FrameQueue
from .transfer_stats import TransferStats
from .wire import frame_chunks, trailer


class KVSender:
    def __init__(self, engine: AsyncEngine, stream: RequestStream, frames: FrameQueue,
                 header: bytes, kv_bytes: int, full_kv_bytes: int, stats: TransferStats,
                 t0: float):
        self.engine, self.stream, self.frames = engine, stream, frames
        self.header, self.kv_bytes, self.full_kv_bytes = header, kv_bytes, full_kv_bytes
        self.stats, self.t0 = stats, t0
        self.done = False
        self.computed_at: float | None = None   # when the engine's stream ended
        # (engine steps run, bytes written) when the first frame went out: the tests' and
        # the docs' evidence of overlap
        self.first_frame_steps: int | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        watch = asyncio.create_task(self._watch())
        listen = asyncio.create_task(self._listen(receive))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/octet-stream")]})
            await self._body(send)
        except OSError:
            pass                        # the client went away: a short stream, cleaned below
        finally:
            listen.cancel()
            watch.cancel()
            self.frames.close()
            if not self.done:
                self.engine.abort(self.stream)
                self.stats.failed += 1

    async def _watch(self) -> None:
        """The request's stream -> the queue's end marker."""
        first, reason = None, None
        try:
            async for ev in self.stream:
                first = ev.token_ids[0] if ev.token_ids else first
                reason = ev.finish_reason
            self.computed_at = time.perf_counter()
            if first is not None and reason in ("length", "stop"):
                self.frames.end(End(first, self.stream.cached_tokens))
            else:
                self.frames.end(Failed(f"the prefill ended without its token ({reason})"))
        except Exception as e:  # noqa: BLE001 - the engine failed the request
            self.frames.end(Failed(f"the prefill failed: {e!r}"))

    async def _listen(self, receive) -> None:
        """A client that disconnects stops the transfer (and the prefill) at once, not at
        the next frame's write."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.frames.end(Failed("client gone"))
        self.frames.close()

    async def _body(self, send) -> None:
        sending = 0.0           # seconds spent handing bytes to the socket
        wire = kv = 0

        async def write(chunk) -> None:
            nonlocal sending, wire
            t = time.perf_counter()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sending += time.perf_counter() - t
            wire += len(chunk)

        await write(self.header)
        while True:
            item = await self.frames.get()
            if isinstance(item, Failed):
                return
            if isinstance(item, End):
                break
            if item.ready is not None and not item.ready.query():
                await asyncio.to_thread(item.wait)      # a GPU copy still in flight
            if self.first_frame_steps is None:
                self.first_frame_steps = self.engine.stats.steps
            for chunk in frame_chunks(item):
                await write(chunk)
            kv += item.nbytes
        if kv != self.kv_bytes:         # a frame missing: never a short payload
            return
        await write(trailer(item.first_token, item.cached_tokens, kv))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.done = True
        st, end = self.stats, time.perf_counter()
        assert self.computed_at is not None
        st.transfers += 1
        st.wire_bytes += wire
        st.kv_bytes += kv
        st.full_kv_bytes += self.full_kv_bytes
        st.prefill_seconds += self.computed_at - self.t0
        st.send_seconds += sending
        st.send_tail_seconds += end - self.computed_at
