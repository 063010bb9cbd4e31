"""RemoteEncoders against fake encoders (an httpx mock transport, answering with the real
wire): hash routing is the ring's; a failing encoder (refused twice, 5xx, cut or corrupt
reply, wrong rows, another tower) leaves the ring and its items go to each key's next encoder on a
ring without it; it comes back after retry_s; with none left, EncoderUnavailable."""
from __future__ import annotations

import time

import httpx
import pytest
import torch

from mimo.multimodal import encoder_wire as ew
from mimo.multimodal.errors import EncoderUnavailable, MediaError
from mimo.multimodal.hash_ring import ConsistentHashRing
from mimo.multimodal.remote_encoders import RemoteEncoders

URLS = ["http://e0:1", "http://e1:1", "http://e2:1"]
GRID = (1, 4, 4)                        # 4 rows after the 2 x 2 merge


def embed_of(key: str) -> torch.Tensor:
    """What a fake encoder answers for a key (so a misplaced answer shows)."""
    return torch.full((4, 3), float(sum(key.encode())))


class Fakes:
    """Each fake caches what it encoded; `calls` are the keys whose pixels it got,
    `probes` the keys it was probed for."""

    def __init__(self):
        self.mode = {u: "ok" for u in URLS}
        self.calls: dict[str, list[str]] = {u: [] for u in URLS}
        self.probes: dict[str, list[str]] = {u: [] for u in URLS}
        self.cached: dict[str, set[str]] = {u: set() for u in URLS}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        fp, items = ew.decode_request(request.read())
        mode = self.mode[url]
        probe = items[0].pixels is None
        (self.probes if probe else self.calls)[url].extend(it.key for it in items)
        if mode == "refused":
            raise httpx.ConnectError("refused", request=request)
        if mode == "500":
            return httpx.Response(500, json={"error": {"message": "boom"}})
        if mode == "400":
            return httpx.Response(400, json={"error": {"message": "bad grid"}})
        hit = [it.key in self.cached[url] for it in items]
        if not probe:
            self.cached[url].update(it.key for it in items)
        embeds = [embed_of(it.key) if h or not probe else torch.empty(0, 0)
                  for it, h in zip(items, hit)]
        if mode == "rows" and not probe:
            embeds = [e[:3] for e in embeds]
        body = ew.encode_reply(ew.EncodeReply("other" if mode == "tower" else fp, hit, embeds))
        if mode == "cut":
            body = body[:len(body) // 2]
        if mode == "corrupt":
            body = body[:-20] + bytes([body[-20] ^ 1]) + body[-19:]
        return httpx.Response(200, content=body)


def client(fakes, routing="hash", retry_s=60.0, probe=True):
    return RemoteEncoders(URLS, "tower", torch.float32, 2, routing, retry_s=retry_s,
                          probe=probe, transport=httpx.MockTransport(fakes))


def items(keys):
    return [(torch.zeros(16, 1176), GRID) for _ in keys]     # 75 KB of patches each


KEYS = [f"media-{i}" for i in range(40)]


def test_hash_routing_is_the_rings_and_round_robin_deals_in_turn():
    enc = client(Fakes())
    ring = ConsistentHashRing(URLS)
    assert [enc.route(k) for k in KEYS] == [ring.route(k) for k in KEYS]
    rr = client(Fakes(), "round-robin")
    assert [rr.route(k) for k in KEYS[:6]] == URLS + URLS


@pytest.mark.parametrize("mode", ["refused", "500", "cut", "corrupt", "rows", "tower"])
def test_a_failing_encoders_items_go_to_the_next_on_the_ring(mode):
    fakes = Fakes()
    enc = client(fakes)
    dead = URLS[1]
    fakes.mode[dead] = mode
    mine = [k for k in KEYS if enc.route(k) == dead]
    assert mine
    reply = enc.encode(dead, mine, items(mine))
    for k, e in zip(mine, reply.embeds):
        assert torch.equal(e, embed_of(k))
    rest = ConsistentHashRing([u for u in URLS if u != dead])
    for u in URLS:
        if u != dead:
            assert fakes.calls[u] == [k for k in mine if rest.route(k) == u]
    assert all(enc.route(k) != dead for k in KEYS)       # out of the ring while down
    # A connection error is tried once more on a fresh connection (an idle keep-alive
    # connection the server closed); a reply that came back is not. Only a bad reply to
    # the pixels (wrong rows) comes after they were sent.
    assert fakes.probes[dead] == mine * (2 if mode == "refused" else 1)
    assert fakes.calls[dead] == (mine if mode == "rows" else [])
    assert enc.retried == 1


def test_a_down_encoder_comes_back_after_retry_s():
    fakes = Fakes()
    enc = client(fakes, retry_s=0.2)
    fakes.mode[URLS[0]] = "refused"
    mine = [k for k in KEYS if enc.route(k) == URLS[0]]
    enc.encode(URLS[0], mine, items(mine))
    assert all(enc.route(k) != URLS[0] for k in mine)
    fakes.mode[URLS[0]] = "ok"
    time.sleep(0.25)
    assert [enc.route(k) for k in mine] == [URLS[0]] * len(mine)


def test_none_left_is_encoder_unavailable_and_a_refused_item_a_media_error():
    fakes = Fakes()
    enc = client(fakes)
    for u in URLS:
        fakes.mode[u] = "500"
    with pytest.raises(EncoderUnavailable, match="no encoder worker"):
        enc.encode(URLS[0], KEYS[:5], items(KEYS[:5]))
    with pytest.raises(EncoderUnavailable):
        enc.route("x")
    fakes = Fakes()
    fakes.mode[URLS[2]] = "400"
    enc = client(fakes)
    with pytest.raises(MediaError, match="bad grid"):
        enc.encode(URLS[2], ["k"], items(["k"]))
    assert enc.route("k") in URLS and not enc._down          # the encoder is not blamed


def test_pixels_cross_only_for_misses():
    fakes = Fakes()
    enc = client(fakes)
    w = URLS[0]
    first = enc.encode(w, KEYS[:3], items(KEYS[:3]))
    assert first.hit == [False] * 3 and first.forwarded
    sent = enc.bytes_sent
    again = enc.encode(w, KEYS[:4], items(KEYS[:4]))      # three cached, one new
    assert again.hit == [True, True, True, False]
    for k, e in zip(KEYS[:4], again.embeds):
        assert torch.equal(e, embed_of(k))
    assert fakes.calls[w] == KEYS[:3] + KEYS[3:4]           # only the new one's pixels
    assert enc.bytes_sent - sent < 2 * (sent // 3)          # a probe + one item's pixels
    plain = client(Fakes(), probe=False)
    plain.encode(w, KEYS[:3], items(KEYS[:3]))
    plain.encode(w, KEYS[:3], items(KEYS[:3]))
    assert plain.bytes_sent > 2 * sent * 0.9                # every item's pixels twice
