"""AsyncEngine: the engine loop on its own thread, fed from an asyncio event loop.

Forward passes never run on the event-loop thread, so the loop keeps answering (health
checks, new connections) while the engine is saturated. Ownership: only the engine thread
touches the LLMEngine's scheduler, pools and model. The loop side sees the engine's face
(face.py): `info` (fixed), `stats` (a snapshot the engine thread swaps in after each
iteration), `check` (does a request fit), `arriving` (a request on its way: arrivals.py),
`submit` (validates, pure) and `abort`, which put commands in the inbox; it reads
per-request asyncio queues that the engine thread fills through `call_soon_threadsafe`.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..kvcache.radix.namespace import CacheScope
from .arrivals import Arrival, Arrivals
from .engine import LLMEngine
from .errors import EngineStopped, StepFailed
from .face import EngineInfo, EngineStats
from .kv_export import FrameSink, KVExport
from .sampling_params import SamplingParams
from .sequence import Sequence
from .snapshot import engine_info, engine_stats

log = logging.getLogger("mimo.engine")


@dataclass
class StreamEvent:
    token_ids: list[int]
    finish_reason: str | None = None     # set on the last event of a request
    error: BaseException | None = None   # the engine failed this request


@dataclass(eq=False)
class RequestStream:
    """One request's view from the event loop."""
    seq: Sequence
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.perf_counter)

    @property
    def cached_tokens(self) -> int:
        return self.seq.cached_tokens

    async def __aiter__(self):
        while True:
            ev = await self.events.get()
            if ev.error is not None:
                raise ev.error
            yield ev
            if ev.finish_reason is not None:
                return


class AsyncEngine:
    def __init__(self, engine: LLMEngine, idle_wait: float = 0.05, gather_wait: float = 0.02):
        if gather_wait < 0:
            raise ValueError(f"gather_wait must be >= 0 seconds, not {gather_wait}")
        self._engine = engine
        self.info: EngineInfo = engine_info(engine)
        self._stats: EngineStats = engine_stats(engine, 0)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._idle_wait = idle_wait
        # Starting from idle, how long the engine may wait for requests on their way
        # (arrivals.py) before it plans its first step.
        self._gather_wait = gather_wait
        self.arrivals = Arrivals(self._wake.set)
        self._thread: threading.Thread | None = None
        self._go: threading.Event | None = None      # set by start() for a `build` engine
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[int, RequestStream] = {}     # engine thread only
        self._steps = 0
        self.last_step_seconds = 0.0
        self.fatal: BaseException | None = None
        # Called (on the event loop) with the error that stopped it.
        self.on_fatal: Callable[[BaseException], object] | None = None

    @classmethod
    def build(cls, factory: Callable[[], LLMEngine], idle_wait: float = 0.05,
              gather_wait: float = 0.02) -> AsyncEngine:
        """Build the engine on the thread that will step it (waits; `factory`'s exception is
        re-raised here). Why: libgomp lets idle OpenMP workers spin only while the process
        has no more of its threads than CPUs. A model loaded on the main thread leaves that
        thread a team of workers; stepping on another thread adds a second team, and from
        then on each parallel region wakes sleeping workers (2 cores: a one-row product 71 ->
        120 us, a served decode 62 tok/s against 95; docs/speed.md)."""
        box: dict = {}
        built, go = threading.Event(), threading.Event()

        def main() -> None:
            try:
                box["engine"] = factory()
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                box["error"] = e
                built.set()
                return
            built.set()
            go.wait()
            box["self"]._run()

        thread = threading.Thread(target=main, name="mimo-engine", daemon=True)
        thread.start()
        built.wait()
        if "error" in box:
            thread.join()
            raise box["error"]
        self = box["self"] = cls(box["engine"], idle_wait, gather_wait)
        self._thread, self._go = thread, go
        return self

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._go is not None:        # built by `build`: its thread waits for the loop
            self._go.set()
            return
        self._thread = threading.Thread(target=self._run, name="mimo-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._go is not None:        # (never started: its thread returns at once)
            self._go.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        # Queued storage writes land before the process goes (a restarted server finds them).
        await asyncio.get_running_loop().run_in_executor(None, self._engine.close)

    # ---- event-loop side ----------------------------------------------------------------
    @property
    def stats(self) -> EngineStats:
        """The engine after its latest iteration (one reference read: never half-updated)."""
        return self._stats

    def check(self, prompt_len: int, max_tokens: int, *, fill: bool = False,
              min_tokens: int = 0) -> int:
        """The max_tokens a request of `prompt_len` tokens runs with, or face.ContextTooLong
        (`fill`: the client sent none; it gets what the context and the KV pool allow)."""
        return self.info.check(prompt_len, max_tokens, fill=fill, min_tokens=min_tokens)

    def arriving(self) -> Arrival:
        """Note a request on its way here (to be tokenized, then submitted): an idle
        engine waits briefly for it before its first step. Close it once submitted (or
        given up); `submit(arrival=...)` does."""
        return self.arrivals.open()

    def submit(self, prompt_ids: list[int], params: SamplingParams, mm=None,
               scope: CacheScope = CacheScope(), arrival: Arrival | None = None
               ) -> RequestStream:
        """Validates now (raises RequestError / ValueError on bad input); generation runs on
        the engine thread. `mm`: an MMPrompt for a prompt with images or videos; `scope`:
        its cache salt and session key; `arrival`: closed once the request is queued."""
        try:
            return self._queue("add", self._new(prompt_ids, params, mm, scope))
        finally:        # after the queue: a waiting engine finds the request when it wakes
            if arrival is not None:
                arrival.close()

    def submit_prefill(self, prompt_ids: list[int], sink: FrameSink,
                       scope: CacheScope = CacheScope()) -> RequestStream:
        """A prefill worker's half of a request: compute the prompt and its greedy first
        token only. While the prompt runs, the engine thread puts its KV into `sink` frame
        by frame (`kvcache.kv_frames.KVFrame`: every full layer's pages, each SWA layer's
        window), each as soon as it is final (engine/kv_export.py); every frame is in the
        sink before the stream's last event (the first token) is emitted."""
        seq = self._new(prompt_ids, SamplingParams(max_tokens=1, temperature=0.0), None, scope)
        seq.kv_export = KVExport(sink)
        return self._queue("add", seq)

    def submit_imported(self, prompt_ids: list[int], params: SamplingParams, payload,
                        first_token: int | None = None, cached_tokens: int = 0,
                        scope: CacheScope = CacheScope()) -> RequestStream:
        """A decode worker's half: run on `payload` (the prompt's KV, computed elsewhere)
        from `first_token` on when given (the caller streams that token itself), else from
        the last prompt token. `cached_tokens`: what the prefill reused, for usage. If the
        first token already ends the request, the stream ends at once."""
        seq = self._new(prompt_ids, params, None, scope)
        seq.cached_tokens = cached_tokens
        if first_token is not None:
            seq.append(first_token)
            if seq.finish_reason is not None:
                stream = RequestStream(seq)
                stream.events.put_nowait(StreamEvent([], seq.finish_reason))
                return stream
        seq.kv_import = payload
        return self._queue("import", seq)

    def _new(self, prompt_ids, params, mm, scope) -> Sequence:
        if self.fatal is not None:
            raise EngineStopped(f"the engine stopped after an internal error: {self.fatal!r}")
        return self._engine.new_sequence(prompt_ids, params, mm, scope)

    def _queue(self, cmd: str, seq: Sequence) -> RequestStream:
        stream = RequestStream(seq)
        self._inbox.put((cmd, stream))
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Stop a request and free its KV at the engine's next step (client gone, stop
        string seen). Idempotent."""
        self._inbox.put(("abort", stream))
        self._wake.set()

    def publisher(self, redis_url: str, url: str, interval: float = 0.5, ttl: float = 3.0):
        """The worker's side of the cache-aware router (cache_publisher.py), following this
        engine's prefix cache; call before `start`."""
        from .cache_publisher import CachePublisher
        return CachePublisher(self.info, lambda: self._stats, self._engine.cache, redis_url,
                              url, interval, ttl)

    def hold(self, stream: RequestStream) -> None:
        """The request's answer ended in a tool call: its session waits for the tool, so
        its cached KV is kept after everything else for a while (`LLMEngine.hold_paused`)."""
        self._inbox.put(("hold", stream))
        self._wake.set()

    # ---- engine thread ----------------------------------------------------------------
    def _emit(self, stream: RequestStream, ev: StreamEvent) -> None:
        assert self._loop is not None       # start() sets it before the engine thread runs
        self._loop.call_soon_threadsafe(stream.events.put_nowait, ev)

    def _publish(self) -> None:
        self._stats = engine_stats(self._engine, self._steps)

    def _drain_inbox(self) -> None:
        eng = self._engine
        while True:
            try:
                cmd, stream = self._inbox.get_nowait()
            except queue.Empty:
                return
            if cmd == "add":
                self._streams[stream.seq.id] = stream
                eng.enqueue(stream.seq)
            elif cmd == "import":
                self._streams[stream.seq.id] = stream
                eng.add_imported(stream.seq, stream.seq.kv_import)
            elif cmd == "hold":
                eng.hold_paused(stream.seq)
            elif cmd == "abort" and stream.seq.id in self._streams:
                eng.abort(stream.seq)
                del self._streams[stream.seq.id]
                self._emit(stream, StreamEvent([], "abort"))

    def _run(self) -> None:
        eng = self._engine
        while not self._stop:
            idle = not eng.has_work()
            self._drain_inbox()
            if not eng.has_work():
                self._publish()     # aborts and storage writes change it while idle
                self._wake.wait(self._idle_wait)
                self._wake.clear()
                continue
            if idle:
                self._gather()
            t0 = time.perf_counter()
            try:
                out = eng.step()
            except StepFailed as e:     # its requests get the error; the loop goes on
                self._fail(e.failed, e)
                self._publish()
                continue
            except BaseException as e:  # noqa: BLE001 - EngineBroken, or a bug outside step()
                self._die(e)
                return
            self._steps += 1
            self.last_step_seconds = time.perf_counter() - t0
            self._publish()
            # One event per request and step: with speculative decoding a step may give a
            # request several tokens, and the finish reason belongs after the last of them.
            per_seq: dict[int, tuple[Sequence, list[int]]] = {}
            for seq, tok in out:
                per_seq.setdefault(seq.id, (seq, []))[1].append(tok)
            for seq, toks in per_seq.values():
                stream = self._streams.get(seq.id)
                if stream is None:
                    continue
                self._emit(stream, StreamEvent(toks, seq.finish_reason))
                if seq.finish_reason is not None:
                    del self._streams[seq.id]

    def _gather(self) -> None:
        """Work just arrived at an idle engine: while requests are still on their way
        (tokenized by the server, not yet queued), wait for them, at most `gather_wait`,
        so that the first step plans them together. Nothing runs yet, so nobody's next
        token waits; a request alone has none on its way and does not wait."""
        end = time.perf_counter() + self._gather_wait
        while self.arrivals.pending and not self._stop:
            left = end - time.perf_counter()
            if left <= 0:
                return
            self._wake.wait(left)
            self._wake.clear()
            self._drain_inbox()

    def _fail(self, seqs, err: BaseException) -> None:
        for seq in seqs:
            stream = self._streams.pop(seq.id, None)
            if stream is not None:
                self._emit(stream, StreamEvent([], "error", error=err))

    def _die(self, err: BaseException) -> None:
        """The engine cannot go on: every request gets the error, `fatal` turns /health
        into 503 and new requests are refused; `on_fatal` (the server: stop the process
        with a non-zero exit) is called on the event loop."""
        log.critical("engine stopped: %r", err, exc_info=err)
        self.fatal = err
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            self._emit(stream, StreamEvent([], "error", error=err))
        if self.on_fatal is not None:
            assert self._loop is not None   # (as in _emit)
            self._loop.call_soon_threadsafe(self.on_fatal, err)
