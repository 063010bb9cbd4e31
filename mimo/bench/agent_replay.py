"""Replaying agent sessions (agent_trace.py) against a running OpenAI-compatible server, as a
closed loop of `concurrency` sessions: each turn is sent when the previous turn's answer is
in and its pause (the tool's run time) has passed.

Two ways to send a session:
- `ids` (/v1/completions, prompts as token ids, any server): turn k's prompt is turn k-1's
  prompt, the answer's tokens (its text through the server's own /tokenize) and the turn's
  new tokens. A completion has no tool calls, so nothing marks the session paused.
- `chat` (/v1/chat/completions with one tool): every turn but the last forces a call
  (tool_choice "required"), which the next turn sends back with a tool message holding the
  result; the last turn may answer (tool_choice "auto": "none" would drop the tool list from
  the rendered prompt, so nothing after BOS would match). What a server does with a
  session paused in a tool call shows here.
Each turn records prompt, cached (usage, or llama-server's timings.cache_n) and output
tokens and its time to first token.
"""
from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from .agent_trace import Session, Turn
from .peer_load import check_loopback

WORDS = ("agent tool call file read write test build error line code path module value "
         "result output input step plan check run list find open close change patch diff "
         "commit branch merge review function class method return import config server "
         "request cache token model window page memory session turn pause resume").split()
TOOL = {"type": "function", "function": {
    "name": "run", "description": "Run a shell command and return its output",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string", "maxLength": 24}},
                   "required": ["cmd"], "additionalProperties": False}}}


def ids_of(seed: int, key: tuple, n: int, vocab: tuple[int, int]) -> list[int]:
    rng = random.Random(f"{seed}:{key}")
    return [rng.randrange(*vocab) for _ in range(n)]


def text_of(seed: int, key: tuple, n: int) -> str:
    rng = random.Random(f"{seed}:{key}")
    return " ".join(rng.choice(WORDS) for _ in range(n))


def block_ids(t: Turn, block: int, vocab: tuple[int, int]) -> list[int]:
    """A Mooncake turn's prompt: each block id names `block` tokens (length scaled from 512
    per block), folded into the vocabulary."""
    n = max(t.prompt_tokens * block // 512, 1)
    span = vocab[1] - vocab[0]
    return [vocab[0] + (h * block + j) % span for h in t.blocks for j in range(block)][:n]


class Replayer:
    def __init__(self, base: str, mode: str, seed: int, vocab: tuple[int, int],
                 system_tokens: int, block: int = 16, kind: str = "mimo", timeout: float = 600):
        import httpx
        check_loopback(base)
        self.base, self.mode, self.seed, self.vocab = base.rstrip("/"), mode, seed, vocab
        self.system_tokens, self.block, self.kind = system_tokens, block, kind
        self.model: str | None = None
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0),
                                      trust_env=False)
        self.records: list[dict] = []
        self.errors: list[str] = []

    async def aclose(self) -> None:
        await self.http.aclose()

    async def run(self, sessions: list[Session], concurrency: int, progress=sys.stderr,
                  label: str = "") -> float:
        """Replay; returns the wall time. Records land in `self.records`."""
        r = await self.http.get(f"{self.base}/v1/models")
        self.model = r.json()["data"][0]["id"]
        queue = list(sessions)[::-1]
        total = sum(len(s.turns) for s in sessions)
        t0 = time.perf_counter()

        async def worker():
            while queue:
                s = queue.pop()
                await self._session(s)
                print(f"[agent] {label}: {len(self.records)}/{total} turns, "
                      f"{time.perf_counter() - t0:.0f}s", file=progress, flush=True)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0

    async def _session(self, s: Session) -> None:
        history: list = []          # ids, or chat messages
        for k, t in enumerate(s.turns):
            try:
                if self.mode == "ids":
                    rec = await self._ids_turn(s, k, t, history)
                else:
                    rec = await self._chat_turn(s, k, t, history)
            except Exception as e:  # noqa: BLE001 - a failed turn ends its session, counted
                self.errors.append(f"session {s.sid} turn {k}: {e!r}"[:300])
                return
            self.records.append({"session": s.sid, "turn": k, **rec})
            if t.pause_s is not None:
                await asyncio.sleep(t.pause_s)

    # ---- ids ------------------------------------------------------------------------------
    async def _ids_turn(self, s: Session, k: int, t: Turn, history: list) -> dict:
        if t.blocks:
            prompt = block_ids(t, self.block, self.vocab)
        else:
            if k == 0:
                history += ids_of(self.seed, ("system",), self.system_tokens, self.vocab)
            history += ids_of(self.seed, (s.sid, k), t.new_tokens, self.vocab)
            prompt = list(history)
        body = {"model": self.model, "prompt": prompt, "max_tokens": t.output_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        rec, text = await self._stream("/v1/completions", body)
        if not t.blocks:
            history += await self._tokenize(text)
        return rec

    async def _tokenize(self, text: str) -> list[int]:
        if not text:
            return []
        if self.kind == "llama-server":
            r = await self.http.post(f"{self.base}/tokenize",
                                     json={"content": text, "add_special": False})
        else:
            r = await self.http.post(f"{self.base}/tokenize",
                                     json={"prompt": text, "add_special_tokens": False})
        r.raise_for_status()
        return list(r.json()["tokens"])

    # ---- chat -----------------------------------------------------------------------------
    async def _chat_turn(self, s: Session, k: int, t: Turn, history: list) -> dict:
        if k == 0:
            history += [{"role": "system", "content": text_of(self.seed, ("system",),
                                                              self.system_tokens)},
                        {"role": "user", "content": text_of(self.seed, (s.sid, k),
                                                            t.new_tokens)}]
        else:
            call = history[-1]["tool_calls"][0]
            history.append({"role": "tool", "tool_call_id": call["id"],
                            "content": text_of(self.seed, (s.sid, k), t.new_tokens)})
        last = t.pause_s is None
        body = {"model": self.model, "messages": history, "tools": [TOOL],
                "tool_choice": "auto" if last else "required",
                "max_tokens": t.output_tokens if last else max(t.output_tokens, 48),
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        rec, calls = await self._stream("/v1/chat/completions", body)
        if not last:
            if not calls:
                raise RuntimeError("no tool call in a turn that forced one")
            history.append({"role": "assistant", "content": None, "tool_calls": calls[:1]})
        return rec

    # ---- one streamed request -------------------------------------------------------------
    async def _stream(self, path: str, body: dict):
        t0 = time.perf_counter()
        t_first = None
        usage, timings, text = None, None, []
        calls: dict[int, dict] = {}
        async with self.http.stream("POST", self.base + path, json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                ev = json.loads(line[5:])
                if "error" in ev:
                    raise RuntimeError(f"server error: {ev['error']}")
                usage = ev.get("usage") or usage
                timings = ev.get("timings") or timings
                for ch in ev.get("choices") or []:
                    d = ch.get("delta") or {}
                    piece = ch.get("text") or d.get("content") or ""
                    if piece or d.get("tool_calls"):
                        t_first = t_first or time.perf_counter()
                    text.append(piece)
                    for tc in d.get("tool_calls") or []:
                        c = calls.setdefault(tc.get("index", 0), {
                            "id": None, "type": "function",
                            "function": {"name": "", "arguments": ""}})
                        c["id"] = c["id"] or tc.get("id")
                        f = tc.get("function") or {}
                        c["function"]["name"] += f.get("name") or ""
                        c["function"]["arguments"] += f.get("arguments") or ""
        usage = usage or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is None and timings:
            cached = timings.get("cache_n")
        rec = {"prompt_tokens": usage.get("prompt_tokens", 0), "cached_tokens": cached or 0,
               "output_tokens": usage.get("completion_tokens", 0),
               "ttft_s": None if t_first is None else t_first - t0}
        out = "".join(text) if path.endswith("/completions") and "messages" not in body \
            else [calls[i] for i in sorted(calls)]
        return rec, out
