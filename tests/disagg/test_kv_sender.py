"""The prefill worker's KV stream is written while the prompt is computed (the endpoint's
ASGI answer driven in-process, its engine on its own thread, one engine step at a time):

- after the first of the prompt's three steps (45 tokens in chunks of 16: plain
  arithmetic) the header and a full layer's first pages are on the wire while the engine
  waits to run the other two;
- inside the last step, the engine is held before its last layer until the frames that
  step made for earlier layers have been written: it gets them only if the sender writes
  while the engine is mid-step;
- the stream decodes (`wire.decode`) into KV on which another engine's greedy tokens equal
  a single engine's;
- a client that disconnects mid-transfer aborts the request: the engine ends idle, its
  pools whole, the queued host copies dropped, the transfer counted failed.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, random_prompts, tiny_mimo_v2_flash_hf
from starlette.requests import Request

from mimo import LLM, SamplingParams
from mimo.disagg import wire
from mimo.disagg.prefill_endpoint import PrefillEndpoint
from mimo.disagg.roles import kv_fingerprint, kv_layout
from mimo.engine.async_engine import AsyncEngine
from mimo.kvcache.kv_frames import KVFrame

P, CHUNK, N = 4, 16, 45
STEPS = -(-N // CHUNK)          # 3


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                     reason="no CUDA device"))


def _llm(hf, device="cpu"):
    return LLM("tiny", loaded=loaded_from_hf(hf), dtype="float32", kv_cache_memory="2MiB",
               page_size=P, max_num_batched_tokens=CHUNK, prefix_cache=False, progress=False,
               device=device)


class Wire:
    """The client's side: what came through `send`, parsed frame by frame as it arrives."""

    def __init__(self):
        self.data, self.frames, self.ended = bytearray(), [], False
        self.status = None
        self._at, self._sizes = 0, None

    async def send(self, msg):
        if msg["type"] == "http.response.start":
            self.status = msg["status"]
            return
        self.data += bytes(msg["body"])
        self.ended = not msg.get("more_body", False)
        self._parse()

    def _parse(self):
        d = self.data
        if self._sizes is None:
            if len(d) < 12 or len(d) < 12 + int.from_bytes(d[8:12], "little"):
                return
            n = int.from_bytes(d[8:12], "little")
            h = json.loads(bytes(d[12:12 + n]))
            item = 4        # float32
            self._sizes = [(k[1] * k[2] + v[1] * v[2]) * item for k, v in h["full"] + h["swa"]]
            self._at = 12 + n
        while len(d) >= self._at + 12:
            layer, first, pages = wire.FRAME.unpack(bytes(d[self._at:self._at + 12]))
            if layer == wire.END:
                return
            size = self._sizes[layer] * pages * P
            if len(d) < self._at + 12 + size:
                return
            self.frames.append((layer, first, pages))
            self._at += 12 + size


class Harness:
    """An AsyncEngine whose steps run only when the test releases them."""

    def __init__(self, llm):
        self.eng = llm.engine
        self.gate = threading.Semaphore(0)
        self.steps = 0
        step = self.eng.step

        def gated():
            assert self.gate.acquire(timeout=60), "step never released"
            out = step()
            self.steps += 1
            return out
        self.eng.step = gated           # the engine thread calls it
        self.aeng = AsyncEngine(self.eng)
        cfg = SimpleNamespace(max_body_bytes=1 << 20, body_read_timeout=10.0)
        server = SimpleNamespace(engine=self.aeng, cfg=cfg, _require_key=lambda r: None)
        self.endpoint = PrefillEndpoint(server, kv_fingerprint(self.aeng), kv_layout(self.aeng))
        self.inbox: asyncio.Queue = asyncio.Queue()

    async def start(self, ids, out: Wire):
        self.aeng.start()
        body = json.dumps({"prompt_ids": ids, "fingerprint": self.endpoint.fingerprint,
                           "wire": wire.VERSION}).encode()
        self.inbox.put_nowait({"type": "http.request", "body": body, "more_body": False})
        scope = {"type": "http", "method": "POST", "path": "/v1/internal/prefill",
                 "headers": [], "query_string": b""}
        resp = await self.endpoint.handle(Request(scope, self.inbox.get))
        return asyncio.create_task(resp(scope, self.inbox.get, out.send))

    async def stop(self):
        self.gate.release(100)
        await self.aeng.stop()


async def _until(cond, what, timeout=60.0):
    t = time.monotonic()
    while not cond():
        assert time.monotonic() - t < timeout, what
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_frames_are_written_while_the_prompt_is_computed(device):
    """(On CUDA the frames are pinned host buffers filled by asynchronous copies that the
    sender waits for.)"""
    hf = tiny_mimo_v2_flash_hf(seed=4)
    llm = _llm(hf, device)
    types = ["full" if t == "full_attention" else "swa" for t in hf.config.layer_types]
    n_full = types.count("full")
    assert types[-1] == "swa" and n_full == 2      # the hold below is before layer 4
    ids = random_prompts(5, [N], 250)[0]
    h, out = Harness(llm), Wire()
    held = {"reached": False, "timed_out": False}

    def hold_last_layer(mod, args):
        if h.steps == STEPS - 1:    # inside the last step, before its last layer
            held["reached"] = True
            t = time.monotonic()
            # full frames of steps 1 and 2, then this step's before layer 4: both full
            # layers' last pages and the window of SWA layers 1 and 2
            while len(out.frames) < 2 * n_full + n_full + 2:
                if time.monotonic() - t > 60:
                    held["timed_out"] = True
                    return
                time.sleep(0.005)
    hook = llm.engine.model.layers[-1].register_forward_pre_hook(hold_last_layer)

    async def main():
        task = await h.start(ids, out)
        await _until(lambda: len(out.data) > 0, "no header")
        assert out.status == 200 and h.steps == 0 and not out.frames   # header first
        h.gate.release()            # the first chunk only
        await _until(lambda: len(out.frames) >= n_full, "no frame after step 1")
        await asyncio.sleep(0.05)
        assert h.steps == 1 < STEPS             # the engine waits for its second step
        assert out.frames == [(0, 0, 4), (1, 0, 4)]     # pages 0-3 of both full layers
        h.gate.release(STEPS - 1)
        await asyncio.wait_for(task, 60)
        assert h.endpoint.last.first_frame_steps is not None
        assert h.endpoint.last.first_frame_steps < STEPS
        await h.stop()
    try:
        asyncio.run(main())
    finally:
        hook.remove()
    assert held == {"reached": True, "timed_out": False}
    assert out.ended and h.endpoint.stats.transfers == 1 and h.endpoint.stats.failed == 0
    assert h.endpoint.stats.wire_bytes == len(out.data)
    llm.engine.check_integrity()

    async def chunks():
        yield bytes(out.data)
    got = asyncio.run(wire.decode(chunks(), h.endpoint.fingerprint,
                                  kv_layout(h.aeng), P, N))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref = _llm(hf, device).generate({"prompt_token_ids": ids}, params)[0].token_ids
    assert got.first_token == ref[0] and got.cached_tokens == 0
    dec = _llm(hf, device).engine
    seq = dec.new_sequence(ids, params)
    seq.append(got.first_token)
    dec.add_imported(seq, got.payload)
    while dec.has_work():
        dec.step()
    assert seq.output_ids == ref


def test_client_gone_mid_transfer_releases_everything():
    llm = _llm(tiny_mimo_v2_flash_hf(seed=4))
    h, out = Harness(llm), Wire()

    async def main():
        task = await h.start(random_prompts(6, [N], 250)[0], out)
        h.gate.release()
        await _until(lambda: out.frames, "no frame after step 1")
        frames = h.endpoint.last.frames
        h.inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(task, 60)
        late = KVFrame(0, 0, 1, torch.zeros(4), torch.zeros(4))
        assert frames.queued_bytes == 0 and not frames.put(late)     # closed: refused
        h.gate.release(100)
        await _until(lambda: h.aeng.stats.running == h.aeng.stats.waiting == 0
                     and h.aeng.stats.steps >= 1, "the request stayed in the engine")
        await h.stop()
    asyncio.run(main())
    assert not out.ended and h.endpoint.stats.failed == 1 and h.endpoint.stats.transfers == 0
    assert h.steps < STEPS              # aborted before its prompt was done
    llm.engine.check_integrity()


def test_a_prefill_failing_midway_ends_the_stream_short():
    """The engine fails the request in its second step (a forward that raises): the frames
    already written stay written, the stream ends without its trailer (a recompute on the
    decode worker), and the engine goes on whole."""
    llm = _llm(tiny_mimo_v2_flash_hf(seed=4))
    h, out = Harness(llm), Wire()
    execute = llm.engine.runner.execute

    def breaks_at_step_2(*a, **kw):
        if h.steps == 1:
            raise RuntimeError("injected")
        return execute(*a, **kw)
    llm.engine.runner.execute = breaks_at_step_2

    async def main():
        task = await h.start(random_prompts(7, [N], 250)[0], out)
        h.gate.release(100)
        await asyncio.wait_for(task, 60)
        await h.stop()
    asyncio.run(main())
    assert out.status == 200 and not out.ended and out.frames == [(0, 0, 4), (1, 0, 4)]
    assert h.endpoint.stats.failed == 1 and h.endpoint.stats.transfers == 0
    assert llm.engine.failed_steps == 1 and not llm.engine.has_work()
    llm.engine.check_integrity()
