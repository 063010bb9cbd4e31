"""RemoteEncoders: a worker's vision encoders in other processes (`--encoder-worker URL`,
each a `server.py --role encoder`), behind the face of EncoderPool that EncodeStage calls:
`route(key)` -> URL, `encode(url, keys, items)` -> WorkerReply (blocking: the stage runs
it in a thread, one per encoder, all at once).

Routing: `hash` (default) places each item on the consistent-hash ring of the live
encoders by its cache key (media hash, settings, salt), so a repeated item reaches the
encoder whose cache holds it; `round-robin` deals items out in turn (the comparison
`python -m mimo.bench encoders` makes).

Failures: an encoder that cannot be reached or drops the connection (twice: once more on
a fresh connection first), answers 5xx, sends a malformed reply or serves another tower
(fingerprint) is marked down for `retry_s` and leaves the ring; the call's items go to
each key's next encoder on the ring (round-robin: the next live one), until one answers.
With none left the call raises EncoderUnavailable (HTTP 503). Replies are checked (item
count, rows per grid, fingerprint, CRC), so a bad reply is a retry, never a token.

Pixels cross only for misses: a call first probes its encoder with the keys alone (the
patches of one 448 x 448 image are about 4.8 MB), then sends the missing items' patches.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time

import httpx
import torch

from . import encoder_wire as ew
from .encoder_pool import WorkerReply
from .errors import EncoderUnavailable, MediaError
from .hash_ring import ConsistentHashRing

log = logging.getLogger("mimo.multimodal")
ROUTINGS = ("hash", "round-robin")


class _Down(Exception):
    """This encoder cannot serve the call (reason in the message)."""


class RemoteEncoders:
    def __init__(self, urls: list[str] | tuple[str, ...], fingerprint: str, dtype: torch.dtype,
                 merge: int, routing: str = "hash", api_key: str | None = None,
                 retry_s: float = 5.0, timeout: float = 300.0, probe: bool = True,
                 transport=None):
        """`probe`: ask for cached embeddings by key before sending pixels; `transport`: an
        httpx transport in place of the network (tests)."""
        if not urls:
            raise ValueError("remote encoders need at least one URL")
        if routing not in ROUTINGS:
            raise ValueError(f"encoder routing must be one of {', '.join(ROUTINGS)}, "
                             f"not {routing!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.fingerprint, self.dtype, self.merge = fingerprint, dtype, merge
        self.routing, self.retry_s = routing, retry_s
        self.names = list(self.urls)
        self.ring = ConsistentHashRing(self.urls)
        self.retried = 0                     # calls that moved to another encoder
        self.probe = probe
        self.bytes_sent = self.bytes_received = 0     # request and reply bodies
        self._down: dict[str, float] = {}    # url -> monotonic time it may be tried again
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._headers = {"content-type": ew.CONTENT_TYPE}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = httpx.Timeout(timeout, connect=5.0)
        self._transport = transport
        # One client per encoder: marking one down closes its pooled connections (a dead
        # peer's sockets are not kept half-closed).
        self._http = {u: self._client() for u in self.urls}

    def _client(self) -> httpx.Client:
        return httpx.Client(headers=self._headers, timeout=self._timeout,
                            transport=self._transport)

    # ---- routing ------------------------------------------------------------------------
    def _live(self) -> list[str]:
        """Under the lock: encoders not marked down (those whose time is up come back)."""
        now = time.monotonic()
        for u, until in list(self._down.items()):
            if until <= now:
                del self._down[u]
                self.ring.add(u)
        return [u for u in self.urls if u not in self._down]

    def route(self, key: str, exclude: frozenset[str] = frozenset()) -> str:
        with self._lock:
            live = [u for u in self._live() if u not in exclude]
            if not live:
                raise EncoderUnavailable("no encoder worker is reachable (all "
                                         f"{len(self.urls)} down or refusing)")
            if self.routing == "round-robin":
                return live[next(self._turn) % len(live)]
            if not exclude:
                return self.ring.route(key)
            return ConsistentHashRing(live).route(key)     # the next live one clockwise

    def down_count(self) -> int:
        """Encoders marked down now."""
        with self._lock:
            return len(self.urls) - len(self._live())

    def _mark_down(self, url: str, why: str) -> None:
        with self._lock:
            if url not in self._down:
                log.warning("encoder worker %s is down for %.0f s: %s", url, self.retry_s, why)
            self._down[url] = time.monotonic() + self.retry_s
            self.ring.remove(url)
            old, self._http[url] = self._http[url], self._client()
        old.close()

    # ---- calls --------------------------------------------------------------------------
    def encode(self, worker: str, keys: list[str], items: list[tuple[torch.Tensor, tuple]]
               ) -> WorkerReply:
        return self._encode(worker, keys, items, frozenset())

    def _encode(self, worker: str, keys: list[str], items: list, tried: frozenset[str]
                ) -> WorkerReply:
        try:
            return self._call(worker, keys, items)
        except _Down as e:
            self._mark_down(worker, str(e))
        tried = tried | {worker}
        self.retried += 1
        groups: dict[str, list[int]] = {}
        for n, k in enumerate(keys):
            groups.setdefault(self.route(k, tried), []).append(n)
        embeds: list = [None] * len(keys)
        hit = [False] * len(keys)
        forwarded = False
        for w, idx in groups.items():
            r = self._encode(w, [keys[n] for n in idx], [items[n] for n in idx], tried)
            forwarded |= r.forwarded
            for n, emb, h in zip(idx, r.embeds, r.hit):
                embeds[n], hit[n] = emb, h
        return WorkerReply(embeds, hit, forwarded)

    def _call(self, url: str, keys: list[str], items: list) -> WorkerReply:
        """A probe first (keys only: the encoder's cache answers what it holds), then the
        pixels of the misses alone; without probing, every item's pixels at once."""
        grids = [(int(g[0]), int(g[1]), int(g[2])) for _, g in items]
        embeds: list = [None] * len(keys)
        hit = [False] * len(keys)
        todo = list(range(len(keys)))
        if self.probe:
            reply = self._post(url, ew.encode_probe(self.fingerprint, list(zip(keys, grids))),
                               len(keys))
            for n, (was_hit, e) in enumerate(zip(reply.hit, reply.embeds)):
                if was_hit:
                    embeds[n], hit[n] = e, True
            todo = [n for n in todo if not hit[n]]
        forwarded = False
        if todo:
            reply = self._post(url, ew.encode_request(self.fingerprint, [
                ew.EncodeItem(keys[n], grids[n], items[n][0].detach().cpu().float())
                for n in todo]), len(todo))
            for n, e, was_hit in zip(todo, reply.embeds, reply.hit):
                embeds[n], hit[n] = e, was_hit
            forwarded = not all(reply.hit)
        for e, (t, h, w) in zip(embeds, grids):
            if e.dim() != 2 or e.shape[0] != t * h * w // self.merge ** 2:
                raise _Down(f"{tuple(e.shape)} embeddings for grid {(t, h, w)}")
        return WorkerReply([e.to(self.dtype) for e in embeds], hit, forwarded)

    def _post(self, url: str, body: bytes, n: int) -> ew.EncodeReply:
        for attempt in (1, 2):
            # A second try on a fresh connection first: the server may have closed an idle
            # keep-alive connection just as this request went out on it.
            try:
                r = self._http[url].post(url + "/v1/internal/encode", content=body)
                break
            except httpx.HTTPError as e:
                if attempt == 2:
                    raise _Down(f"{type(e).__name__}: {e}") from None
        self.bytes_sent += len(body)
        self.bytes_received += len(r.content)
        if r.status_code in (400, 413):         # this request, not the encoder
            raise MediaError(f"the encoder worker refused the media: {_message(r)}")
        if r.status_code != 200:
            raise _Down(f"HTTP {r.status_code}: {_message(r)}")
        try:
            reply = ew.decode_reply(r.content)
        except ew.WireError as e:
            raise _Down(f"malformed reply: {e}") from None
        if reply.fingerprint != self.fingerprint:
            raise _Down(f"it serves another encoder ({reply.fingerprint[:12]}, not "
                        f"{self.fingerprint[:12]})")
        if len(reply.embeds) != n:
            raise _Down(f"{len(reply.embeds)} embeddings for {n} items")
        return reply

    def close(self) -> None:
        for c in self._http.values():
            c.close()


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except Exception:   # noqa: BLE001 - not our JSON error: show the start of the body
        return r.text[:200]
