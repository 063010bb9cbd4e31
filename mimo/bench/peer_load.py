"""bench peers' workload and client, the same for every server (copied from the peers set-up's
load.py so that it runs from a checkout alone): streamed /v1/completions, greedy, EOS ignored.

  (a) single stream: a `prompt_tokens` prompt, `max_tokens` output tokens; decode tokens/s =
      (tokens - 1) / (last token - first token), best of `single_runs`; TTFT, the median of
      the runs' (one run's TTFT, a few tenths of a second, moves by a third with the
      machine's noise; the best decode run's TTFT was an arbitrary pick).
  (b) `concurrency` streams with distinct prompts of the same length: aggregate output
      tokens/s = all output tokens / (last token of any stream - first request sent), and the
      median TTFT.
  (c) one `long_tokens` prompt sent twice: TTFT cold, then of the repeat.
  (d) a `long_tokens` prompt, then one sharing its first `shared_prefix` tokens: TTFT of
      each, and the cached tokens each server reports.
  (c) and (d) run `long_runs` times on fresh prompts; each TTFT is the runs' median (a
  single repeat, tens of milliseconds, doubled now and then with the machine's noise).

Prompts are random words from a list whose every word is one Gemma 3 token after a space and
never merges with its neighbour, so "The w1 ... wn" is exactly n + 2 tokens with BOS. The
words change with the seed, so (c) and (d) start cold against a server that saw earlier runs.
Only loopback base URLs are accepted, and the HTTP client ignores proxy variables.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import statistics
import time
from dataclasses import dataclass
from urllib.parse import urlparse

# Each is one token ('▁word') in Gemma 3's tokenizer, and no two adjacent ones merge.
WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect class control care field development role effort rate heart drug show "
    "leader light voice wife police mind price report decision son view relationship town road "
    "arm difference value building action model season society tax director position player "
    "record paper space ground form event official matter center couple site project activity "
    "star table need court oil situation cost industry figure street image phone data picture "
    "practice piece land product doctor wall patient worker news test movie north love support "
    "technology step baby computer type attention film tree source organization hair window "
    "evidence population truth song garden river mountain ocean forest island valley desert "
    "bridge castle village harbor kitchen library museum station theater farm lake stream "
    "cloud storm rain snow wind summer winter spring evening planet engine wheel train ship "
    "plane paint letter poem novel page author reader legend hero king queen prince knight "
    "pilot farmer painter singer writer nurse judge lawyer captain neighbor uncle brother "
    "sister daughter enemy animal horse tiger lion eagle wolf bear fox rabbit mouse snake fish "
    "bird apple orange lemon bread cheese butter honey coffee tea wine soup salt sugar rice "
    "corn stone iron gold silver glass wood cotton quiet bright dark cold warm heavy small "
    "large ancient modern simple strange happy sad angry calm proud wild green blue red yellow "
    "white black silent hidden open broken empty full early late slow fast deep high low long "
    "short young old new rich poor strong weak soft hard sweet fresh rare common famous runs "
    "writes reads builds opens finds keeps brings holds turns shows hears plays moves lives "
    "believes watches follows learns changes leads stands grows teaches waits travels returns "
    "explains"
).split()


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 256
    max_tokens: int = 128
    single_runs: int = 3
    long_runs: int = 3
    concurrency: int = 16
    long_tokens: int = 3000
    shared_prefix: int = 2000

    def __post_init__(self):
        if min(self.prompt_tokens, self.long_tokens) < 3 or self.max_tokens < 2:
            raise ValueError("prompts need >= 3 tokens and outputs >= 2")
        if min(self.single_runs, self.long_runs, self.concurrency) < 1:
            raise ValueError("single_runs, long_runs and concurrency must be >= 1")
        if not 3 <= self.shared_prefix < self.long_tokens:
            raise ValueError("shared_prefix must lie in [3, long_tokens)")


# load.py --quick: the smoke sizes.
QUICK = Workload(max_tokens=32, single_runs=1, long_runs=1, concurrency=4, long_tokens=1200,
                 shared_prefix=800)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def prompt_of(rng: random.Random, tokens: int) -> str:
    """`tokens` Gemma 3 tokens with BOS: 'The' + tokens - 2 words."""
    return "The " + words(rng, max(1, tokens - 2))


def shared_pair(rng: random.Random, tokens: int, shared: int) -> tuple[str, str]:
    """Two `tokens`-token prompts whose first `shared` tokens are the same, then differ."""
    prefix = prompt_of(rng, shared)
    tail = max(1, tokens - shared)
    return prefix + " " + words(rng, tail), prefix + " " + words(rng, tail)


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    ok = host == "localhost"
    try:
        ok = ok or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not ok:
        raise ValueError(f"refusing non-loopback base URL {url!r}")


def r3(x):
    return None if x is None else round(x, 3)


class Client:
    def __init__(self, base: str, timeout: float = 600.0):
        import httpx
        check_loopback(base)
        self.base = base.rstrip("/")
        self.model: str | None = None
        # trust_env=False: no proxy variable can route this anywhere but the given address.
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0),
                                      trust_env=False, limits=httpx.Limits(max_connections=64))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def discover_model(self) -> str:
        r = await self.http.get(f"{self.base}/models")
        r.raise_for_status()
        self.model = r.json()["data"][0]["id"]
        return self.model

    def body(self, prompt: str, max_tokens: int) -> dict:
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}

    async def complete(self, prompt: str, max_tokens: int) -> dict:
        """Streams one completion; times the first and last token."""
        t0 = time.perf_counter()
        t_first = t_last = None
        chunks, usage, timings, finish = 0, None, None, None
        async with self.http.stream("POST", f"{self.base}/completions",
                                    json=self.body(prompt, max_tokens)) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:500]}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    raise RuntimeError(f"server error: {ev['error']}")
                now = time.perf_counter()
                usage = ev.get("usage") or usage
                timings = ev.get("timings") or timings
                for ch in ev.get("choices") or []:
                    if ch.get("text") or ch.get("finish_reason") is None:
                        chunks += 1
                        t_first = t_first or now
                        t_last = now
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
                        t_last, t_first = t_last or now, t_first or now
        n = (usage or {}).get("completion_tokens") or chunks
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is None and timings and "cache_n" in timings:    # llama-server
            cached = timings["cache_n"]
        return {"t0": t0, "t_first": t_first, "t_last": t_last, "tokens": n,
                "prompt_tokens": (usage or {}).get("prompt_tokens"), "cached_tokens": cached,
                "finish": finish}


async def wait_ready(client: Client, started: float, timeout: float, alive) -> dict:
    """Poll until the server answers a one-token completion. `started`: time.perf_counter()
    when the server was spawned; `alive()` False ends the wait (the server exited). Returns
    the start-up time to that first answered request, and to /v1/models answering."""
    import httpx
    models_s = None
    while time.perf_counter() - started < timeout:
        if not alive():
            raise RuntimeError("server exited before answering")
        try:
            if client.model is None:
                await client.discover_model()
                models_s = time.perf_counter() - started
            await client.complete("The", 1)
            return {"startup_s": r3(time.perf_counter() - started), "models_s": r3(models_s),
                    "model": client.model}
        except (httpx.HTTPError, RuntimeError, KeyError, IndexError, ValueError):
            await asyncio.sleep(0.25)
    raise TimeoutError(f"no answered request within {timeout:.0f} s")


def stream_stats(res: dict) -> dict:
    dec = res["t_last"] - res["t_first"]
    return {"prompt_tokens": res["prompt_tokens"], "output_tokens": res["tokens"],
            "ttft_s": r3(res["t_first"] - res["t0"]),
            "decode_tok_s": r3((res["tokens"] - 1) / dec) if dec > 0 and res["tokens"] > 1 else None,
            "e2e_tok_s": r3(res["tokens"] / (res["t_last"] - res["t0"])), "finish": res["finish"]}


async def run_workload(client: Client, w: Workload, seed: int, log=lambda m: None) -> dict:
    """Parts (a)-(d) against a ready server; errors are reported in the result, not raised."""
    rng = random.Random(seed)
    out: dict = {"errors": []}
    try:
        await client.complete(prompt_of(rng, 16), 4)                    # warm-up, not counted
        log("(a) single stream")
        runs = [stream_stats(await client.complete(prompt_of(rng, w.prompt_tokens), w.max_tokens))
                for _ in range(w.single_runs)]
        best = max(runs, key=lambda s: s["decode_tok_s"] or 0)
        out["a_single"] = dict(best, runs=len(runs), decode_tok_s_all=[s["decode_tok_s"] for s in runs],
                               ttft_s=r3(statistics.median(s["ttft_s"] for s in runs)),
                               ttft_s_all=[s["ttft_s"] for s in runs])
        log(f"(b) {w.concurrency} concurrent streams")
        prompts = [prompt_of(rng, w.prompt_tokens) for _ in range(w.concurrency)]
        t0 = time.perf_counter()
        res = await asyncio.gather(*(client.complete(p, w.max_tokens) for p in prompts))
        wall = max(r["t_last"] for r in res) - t0
        per = [stream_stats(r) for r in res]
        rates = [s["decode_tok_s"] for s in per if s["decode_tok_s"]]
        out["b_concurrent"] = {
            "streams": w.concurrency, "output_tokens": sum(r["tokens"] for r in res),
            "wall_s": r3(wall), "aggregate_tok_s": r3(sum(r["tokens"] for r in res) / wall),
            "ttft_s_median": r3(statistics.median(s["ttft_s"] for s in per)),
            "ttft_s_max": r3(max(s["ttft_s"] for s in per)),
            "per_stream_decode_tok_s_median": r3(statistics.median(rates)) if rates else None,
            "min_output_tokens": min(r["tokens"] for r in res)}
        pairs = []
        for i in range(w.long_runs):
            log(f"(c) a {w.long_tokens}-token prompt, twice ({i + 1}/{w.long_runs})")
            p = prompt_of(rng, w.long_tokens)
            pairs.append((await client.complete(p, 2), await client.complete(p, 2)))
        out["c_repeat"] = _pairs(pairs)
        pairs = []
        for i in range(w.long_runs):
            log(f"(d) a {w.long_tokens}-token prompt, then one sharing {w.shared_prefix} "
                f"tokens ({i + 1}/{w.long_runs})")
            p1, p2 = shared_pair(rng, w.long_tokens, w.shared_prefix)
            pairs.append((await client.complete(p1, 2), await client.complete(p2, 2)))
        out["d_shared_prefix"] = _pairs(pairs)
    except Exception as e:        # noqa: BLE001 - reported in the JSON line, not hidden
        out["errors"].append(f"{type(e).__name__}: {e}")
    return out


def _pairs(pairs: list[tuple[dict, dict]]) -> dict:
    """Each request's TTFT as the runs' median, every run's kept; the cached tokens of the
    last run (the same prompt sizes each run)."""
    firsts = [r3(a["t_first"] - a["t0"]) for a, _ in pairs]
    seconds = [r3(b["t_first"] - b["t0"]) for _, b in pairs]
    first, second = pairs[-1]
    return {"prompt_tokens": [first["prompt_tokens"], second["prompt_tokens"]], "runs": len(pairs),
            "ttft_first_s": r3(statistics.median(firsts)), "ttft_first_s_all": firsts,
            "ttft_second_s": r3(statistics.median(seconds)), "ttft_second_s_all": seconds,
            "cached_tokens_first": first["cached_tokens"],
            "cached_tokens_second": second["cached_tokens"]}
