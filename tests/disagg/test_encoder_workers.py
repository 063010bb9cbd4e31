"""Encoder workers (`server.py --role encoder`) behind a worker given `--encoder-worker`, as
real processes on loopback with a tiny Qwen2.5-VL (float32): the same greedy answers as one
`--role both` worker, prefix cache on and off; two encoders sharing one shared-memory cache
(an item one encoded is a hit on the other); and an encoder SIGKILLed mid-request (its reply
cut by a relay): the answer comes from the other encoder, then one clean 503 when none is
left, with no socket, KV page or /dev/shm segment left behind."""
from __future__ import annotations

import base64
import io
import os
import re
import signal
import socket
import threading
import uuid

import httpx
import pytest
import torch
from helpers.api_server import ServerProcess, vlm_server_process
from helpers.media import MEDIA_DIR, media_path

GREEDY = dict(temperature=0, max_tokens=8)
NAMED = ("--served-model-name", "m")
ASK = {"type": "text", "text": "What is in this picture?"}


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def noise_png(seed: int, w: int = 64, h: int = 56) -> dict:
    from PIL import Image
    g = torch.Generator().manual_seed(seed)
    px = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "PNG")
    return image("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())


class KillingRelay:
    """Loopback TCP relay to `upstream`; once armed, the next reply from upstream is cut
    after its first bytes, and `on_cut` (a SIGKILL) runs: an encoder dying mid-reply."""

    def __init__(self, upstream: int, on_cut):
        self.upstream, self.on_cut = upstream, on_cut
        self.armed = self.cut = False
        self._ls = socket.create_server(("127.0.0.1", 0))
        self.port = self._ls.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self._ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            up = socket.create_connection(("127.0.0.1", self.upstream))
        except OSError:
            c.close()
            return

        def forward():
            try:
                while data := c.recv(65536):
                    up.sendall(data)
            except OSError:
                pass
        threading.Thread(target=forward, daemon=True).start()
        try:
            while data := up.recv(65536):
                if self.armed and not self.cut:
                    c.sendall(data[:64])
                    self.cut = True
                    self.on_cut()
                    break
                c.sendall(data)
        except OSError:
            pass
        finally:
            for s in (c, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from mimo.models.tiny import qwen2_5_vl
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    qwen2_5_vl.write(d, seed=3)
    return d


def shm_files(name: str) -> list[str]:
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(name))


@pytest.fixture(scope="module")
def shm_name():
    name = f"mimo-test-{uuid.uuid4().hex[:10]}"
    yield name
    left = shm_files(name)
    for f in left:
        os.unlink(f"/dev/shm/{f}")
    assert not left, f"left in /dev/shm: {left}"


@pytest.fixture(scope="module")
def procs(vlm_dir, shm_name):
    """ref: one plain worker; a, b: encoders sharing a shared-memory cache; front: a worker
    using a and b (prefix cache on); nopc: one using a through a relay, and b (prefix cache
    off; the fault test cuts the relay)."""
    started: dict = {}
    try:
        started["ref"] = vlm_server_process(vlm_dir, MEDIA_DIR, *NAMED)
        for k in ("a", "b"):
            started[k] = ServerProcess("--role", "encoder", "--model", str(vlm_dir), "--dtype",
                                       "float32", "--encoder-shm-cache-mb", "16",
                                       "--encoder-shm-name", shm_name)
        relay = KillingRelay(started["a"].port, lambda: os.kill(started["a"].pid, signal.SIGKILL))
        started["relay"] = relay
        started["front"] = vlm_server_process(vlm_dir, MEDIA_DIR, *NAMED, "--encoder-worker",
                                              started["a"].url, "--encoder-worker",
                                              started["b"].url)
        started["nopc"] = vlm_server_process(vlm_dir, MEDIA_DIR, *NAMED, "--no-prefix-cache",
                                             "--encoder-worker", f"http://127.0.0.1:{relay.port}",
                                             "--encoder-worker", started["b"].url)
        yield started
    finally:
        for k, p in started.items():
            if k != "relay":
                p.stop()


def client(proc):
    from openai import OpenAI
    return OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=300)


def chat(proc, parts, **kw):
    return client(proc).chat.completions.create(
        model="m", messages=[{"role": "user", "content": parts}], **{**GREEDY, **kw})


def same_answer(got, want) -> None:
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert got.usage.completion_tokens == want.usage.completion_tokens


def counter(proc, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", httpx.get(proc.url + "/metrics", timeout=10).text,
                  re.M)
    assert m, name
    return float(m.group(1))


ASKS = [[image(str(media_path("astronaut.png"))), ASK],
        [image(str(media_path("rocket.jpg"))), ASK],
        [image(str(media_path("coffee.png"))), image(str(media_path("rocket.jpg"))), ASK],
        [noise_png(1), noise_png(2), noise_png(3), ASK],
        [{"type": "video_url", "video_url": {"url": str(media_path("nasa_13013.mp4")),
                                             "max_frames": 4}}, ASK]]


@pytest.mark.parametrize("front", ["front", "nopc"])
def test_answers_equal_one_worker_with_prefix_cache_on_and_off(procs, front):
    for parts in ASKS + ASKS[:2]:          # repeats: embedding (and prefix) cache hits
        same_answer(chat(procs[front], parts), chat(procs["ref"], parts))
    procs[front].assert_pools_idle()


def test_a_repeat_skips_the_encoder_and_encoders_share_the_segment(procs):
    from mimo.multimodal import encoder_wire as ew
    front = procs["front"]
    parts = [noise_png(40), ASK]
    chat(front, parts)
    hits, forwards = (counter(front, "mimo_embed_cache_hits_total"),
                      counter(front, "mimo_encoder_forwards_total"))
    chat(front, parts)
    assert counter(front, "mimo_embed_cache_hits_total") == hits + 1
    assert counter(front, "mimo_encoder_forwards_total") == forwards
    # Straight to each encoder: a key a encoded is a hit on b, through shared memory.
    fp = httpx.get(procs["a"].url + "/v1/internal/encoder").json()["fingerprint"]
    px = torch.randn(64, 1176, generator=torch.Generator().manual_seed(7))
    body = ew.encode_request(fp, [ew.EncodeItem(f"direct-{uuid.uuid4()}", (1, 8, 8), px)])
    replies = [ew.decode_reply(httpx.post(procs[k].url + "/v1/internal/encode", content=body,
                                          timeout=60).content) for k in ("a", "b")]
    assert [r.hit for r in replies] == [[False], [True]]
    assert torch.equal(replies[0].embeds[0], replies[1].embeds[0])
    assert replies[0].embeds[0].shape == (16, replies[0].embeds[0].shape[1])
    stats = httpx.get(procs["b"].url + "/v1/internal/encoder").json()
    assert stats["shm"]["hits_here"] >= 1
    wrong = httpx.post(procs["a"].url + "/v1/internal/encode", content=ew.encode_request(
        fp, [ew.EncodeItem("rows-off", (1, 8, 8), px[:60])]))      # 60 rows for 64 patches
    assert wrong.status_code == 400 and "do not match grid" in wrong.json()["error"]["message"]
    bad = httpx.post(procs["a"].url + "/v1/internal/encode",
                     content=ew.encode_request("another-tower", [ew.EncodeItem("k", (1, 8, 8), px)]))
    assert bad.status_code == 409 and bad.json()["error"]["code"] == "encoder_mismatch"
    cut = httpx.post(procs["a"].url + "/v1/internal/encode", content=body[:-9])
    assert cut.status_code == 400 and "malformed" in cut.json()["error"]["message"]


def test_concurrent_requests_share_tower_forwards(procs):
    """Requests from many callers at once are batched: fewer forwards than requests."""
    import concurrent.futures as cf

    from mimo.multimodal import encoder_wire as ew
    url = procs["b"].url
    fp = httpx.get(url + "/v1/internal/encoder").json()["fingerprint"]
    g = torch.Generator().manual_seed(11)
    bodies = [ew.encode_request(fp, [ew.EncodeItem(f"batch-{uuid.uuid4()}", (1, 32, 32),
                                                   torch.randn(1024, 1176, generator=g))])
              for _ in range(8)]
    before = httpx.get(url + "/v1/internal/encoder").json()["forwards"]
    with cf.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda b: httpx.post(url + "/v1/internal/encode", content=b,
                                              timeout=120), bodies))
    assert [r.status_code for r in rs] == [200] * 8
    assert all(ew.decode_reply(r.content).hit == [False] for r in rs)
    forwards = httpx.get(url + "/v1/internal/encoder").json()["forwards"] - before
    assert 1 <= forwards < 8


def test_an_encoder_with_tower_processes_joins_the_segment(procs, vlm_dir, shm_name):
    """`--role encoder --encoder-workers 2`: the towers run in two processes behind one
    endpoint, each cache in front of the same segment as the other encoders'."""
    from mimo.multimodal import encoder_wire as ew
    pool = ServerProcess("--role", "encoder", "--model", str(vlm_dir), "--dtype", "float32",
                         "--encoder-workers", "2", "--encoder-shm-cache-mb", "16",
                         "--encoder-shm-name", shm_name)
    try:
        fp = httpx.get(procs["a"].url + "/v1/internal/encoder").json()["fingerprint"]
        assert httpx.get(pool.url + "/v1/internal/encoder").json()["fingerprint"] == fp
        g = torch.Generator().manual_seed(21)
        its = [ew.EncodeItem(f"pool-{uuid.uuid4()}", (1, 8, 8), torch.randn(64, 1176, generator=g))
               for _ in range(2)]
        post = lambda url, body: ew.decode_reply(httpx.post(         # noqa: E731
            url + "/v1/internal/encode", content=body, timeout=120).content)
        by_a = post(procs["a"].url, ew.encode_request(fp, its[:1]))
        assert post(pool.url, ew.encode_probe(fp, [(its[0].key, its[0].grid)])).hit == [False]
        got = post(pool.url, ew.encode_request(fp, its))
        assert got.hit == [True, False]            # a's item through shared memory
        assert torch.equal(got.embeds[0], by_a.embeds[0])
        by_b = post(procs["b"].url, ew.encode_request(fp, its[1:]))
        assert by_b.hit == [True]                  # the pool's item, the other way
        torch.testing.assert_close(got.embeds[1], by_b.embeds[0], rtol=0, atol=0)
    finally:
        pool.stop()


def test_an_encoder_with_a_key_refuses_callers_without_it(vlm_dir):
    from mimo.multimodal import encoder_wire as ew
    from mimo.multimodal.remote_encoders import RemoteEncoders
    enc = ServerProcess("--role", "encoder", "--model", str(vlm_dir), "--dtype", "float32",
                        "--api-key", "sekret")
    try:
        for path in ("/v1/internal/encoder", "/v1/internal/encode"):
            r = httpx.request("GET" if path.endswith("encoder") else "POST", enc.url + path,
                              content=b"" if path.endswith("encode") else None)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        fp = httpx.get(enc.url + "/v1/internal/encoder",
                       headers={"Authorization": "Bearer sekret"}).json()["fingerprint"]
        px = torch.randn(64, 1176, generator=torch.Generator().manual_seed(3))
        keyed = RemoteEncoders([enc.url], fp, torch.float32, 2, api_key="sekret")
        assert keyed.encode(enc.url, ["k"], [(px, (1, 8, 8))]).embeds[0].shape[0] == 16
        keyed.close()
        assert httpx.get(enc.url + "/health").status_code == 200      # health needs no key
        r = httpx.post(enc.url + "/v1/internal/encode", content=ew.encode_probe(fp, [("k", (1, 8, 8))]),
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    finally:
        enc.stop()


def sockets_to(pid: int, ports: set[int]) -> int:
    """TCP sockets the process holds (any state) whose peer is one of `ports` on loopback:
    /proc/PID/fd names each socket's inode, /proc/PID/net/tcp its peer."""
    inodes = set()
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{f}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    with open(f"/proc/{pid}/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            cols = line.split()
            if cols[9] in inodes and int(cols[2].split(":")[1], 16) in ports:
                n += 1
    return n


def test_an_encoder_killed_mid_request(procs, shm_name):
    """Runs last in this module: it kills both encoders."""
    front, ref, relay = procs["nopc"], procs["ref"], procs["relay"]
    same_answer(chat(front, ASKS[0]), chat(ref, ASKS[0]))
    relay.armed = True
    seed = 100
    while not relay.cut and seed < 120:       # until a request's items reach encoder a
        parts = [noise_png(seed), noise_png(seed + 1), ASK]
        same_answer(chat(front, parts), chat(ref, parts))
        seed += 2
    assert relay.cut, "no item was routed to encoder a"
    assert counter(front, "mimo_encoder_retries_total") >= 1
    assert counter(front, "mimo_encoder_workers_down") == 1
    procs["a"].proc.wait(30)
    parts = [noise_png(500), ASK]
    same_answer(chat(front, parts), chat(ref, parts))          # b alone now
    enc_ports = {relay.port, procs["b"].port}
    assert sockets_to(front.pid, enc_ports) >= 1           # keep-alive to b: the check sees it
    assert shm_files(shm_name)                                # b still holds the segment
    os.kill(procs["b"].pid, signal.SIGKILL)
    procs["b"].proc.wait(30)
    r = httpx.post(front.url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": [noise_png(600), ASK]}],
        **GREEDY})
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "encoder_unavailable"
    assert set(err) == {"message", "type", "param", "code"}
    text = chat(front, [ASK])                                 # no media: still served
    assert text.choices[0].finish_reason in ("length", "stop")
    front.assert_pools_idle()
    assert sockets_to(front.pid, enc_ports) == 0           # none kept to dead encoders
    # Both users died without detaching: the next one reclaims the segment, and leaves
    # nothing behind when it exits.
    from mimo.multimodal.shm_cache import SharedEmbedCache
    stale = shm_files(shm_name)
    assert stale == [f"{shm_name}.lock", f"{shm_name}.seg", f"{shm_name}.users"]
    with SharedEmbedCache(shm_name, 1 << 20, "fp") as c:
        assert c.reclaimed
    assert shm_files(shm_name) == []


@pytest.mark.parametrize("flags, message", [
    (["--encoder-worker", "ftp://127.0.0.1:1"], "must be http(s)://HOST:PORT"),
    (["--encoder-worker", "http://127.0.0.1:1", "--encoder-workers", "2"], "exclude each other"),
    (["--encoder-shm-cache-mb", "-1"], "encoder_shm_cache_mb must be >= 0"),
    (["--encoder-shm-name", "../etc"], "encoder_shm_name must be"),
    (["--role", "encoder", "--encoder-worker", "http://127.0.0.1:1"], "drop --encoder-worker"),
    (["--role", "encoder"], "has no vision tower"),           # the default text model
])
def test_bad_encoder_flags_are_refused_clearly(flags, message, capsys):
    import server as server_main
    assert server_main.main(flags) == 2
    assert message in capsys.readouterr().err


def test_encoder_flags_in_help(capsys):
    import server as server_main
    with pytest.raises(SystemExit):
        server_main.main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--encoder-worker", "--encoder-routing", "--encoder-shm-cache-mb",
                 "--encoder-shm-name", "encoder:"):
        assert flag in out
