"""Compose your own pipeline with mimo.pipeline: embed a folder of text files.

    python examples/custom_pipeline.py [FOLDER]

Without FOLDER it makes a small one in a temporary directory. No model, no network: the
"embedding model" is a hashing trick, standing in for a real encoder's batched forward.

Each request is a typed `Request` subclass (Doc): every stage reads the fields it needs and
fills the ones it declares. It shows the three kinds of stage a user writes:
  * a Stage (per request, bounded concurrency): ReadFile, and a plain async function;
  * a BatchStage (cross-request batching under a size and a token budget): Embed;
  * streaming stages (many outputs per request, produced on another thread, the way the
    server streams tokens from its engine thread): Typewriter -> Shout.
"""
from __future__ import annotations

import asyncio
import hashlib
import math
import pathlib
import sys
import tempfile
import threading
from dataclasses import dataclass, field

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout
from mimo.pipeline import BatchStage, InvalidRequest, Pipeline, PipelineError, Request, Stage

DIM = 16


@dataclass(eq=False, kw_only=True)
class Doc(Request):
    path: str
    text: str = ""                                    # ReadFile fills it
    words: list[str] = field(default_factory=list)    # tokenize fills it
    batch: int = 0                                    # Embed: which batch it rode in


class ReadFile(Stage):
    """Reads req.path into req.text. File I/O blocks, so it runs in a thread; at most 4 at
    once."""
    max_concurrency = 4

    async def process(self, req: Doc):
        path = pathlib.Path(req.path)
        try:
            req.text = await asyncio.to_thread(path.read_text, encoding="utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{path.name} is not UTF-8 text") from None   # a client fault


async def tokenize(req: Doc):
    """A bare async function is a stage too (named 'tokenize')."""
    req.words = [w.strip(".,;:!?\"'()").lower() for w in req.text.split()]


class Embed(BatchStage):
    """One 'forward' for many documents: up to 4 documents or 64 tokens per batch, waiting
    at most 5 ms for companions. Each document gets its own vector back, or its own error."""
    max_batch_size = 4
    max_batch_cost = 64
    max_wait_ms = 5.0

    def __init__(self):
        super().__init__()
        self.batch_sizes: list[int] = []

    def cost(self, req: Doc):
        return len(req.words)

    async def process_batch(self, reqs: list[Doc]):
        self.batch_sizes.append(len(reqs))
        for r in reqs:
            r.batch = len(self.batch_sizes)
        docs = [r.words for r in reqs]
        vectors = await asyncio.to_thread(_embed_many, docs)   # the "model" off the loop
        # An exception in a slot fails that document only; the rest of the batch succeeds.
        return [v if v is not None else InvalidRequest("empty document") for v in vectors]


def _embed_many(docs: list[list[str]]) -> list[list[float] | None]:
    out = []
    for words in docs:
        if not words:
            out.append(None)
            continue
        v = [0.0] * DIM
        for w in words:
            h = hashlib.blake2b(w.encode(), digest_size=8).digest()
            v[h[0] % DIM] += 1.0 if h[1] & 1 else -1.0
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        out.append([x / norm for x in v])
    return out


class Typewriter(Stage):
    """Streams a document's words, produced on a worker thread (as an engine thread
    produces tokens). Items cross to the event loop with call_soon_threadsafe; when the
    request is cancelled or the consumer stops, `finally` tells the thread to stop."""

    async def process(self, req: Doc):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()

        def produce():
            for w in req.words:
                if stop.wait(0.001):             # pretend each word takes work
                    return
                loop.call_soon_threadsafe(q.put_nowait, w)
            loop.call_soon_threadsafe(q.put_nowait, None)

        worker = threading.Thread(target=produce, daemon=True)
        worker.start()
        try:
            while (w := await q.get()) is not None:
                yield w
        finally:
            stop.set()


class Shout(Stage):
    """A transform after a streaming stage: takes (req, upstream); stops after 6 words, which
    closes the Typewriter (and its thread) at once."""

    async def process(self, req, upstream):
        n = 0
        async for w in upstream:
            yield w.upper()
            n += 1
            if n == 6:
                return


def _sample_folder() -> pathlib.Path:
    d = pathlib.Path(tempfile.mkdtemp(prefix="mimo-example-"))
    texts = {
        "cats.txt": "Cats sleep most of the day and hunt small animals at night.",
        "dogs.txt": "Dogs are loyal animals; they guard the house and love long walks.",
        "tea.txt": "Green tea and black tea come from the same plant, processed differently.",
        "coffee.txt": "Coffee beans are roasted seeds; espresso is coffee brewed under pressure.",
        "rivers.txt": "Rivers carry water from mountains to the sea, carving valleys.",
        "sea.txt": "The sea covers most of the planet and rivers feed it fresh water.",
        "long.txt": " ".join(["a long document with many words"] * 12),
        "empty.txt": "",
    }
    for name, text in texts.items():
        (d / name).write_text(text, encoding="utf-8")
    (d / "binary.txt").write_bytes(b"\xff\xfe\x00 not utf-8")
    return d


async def main(folder: pathlib.Path) -> None:
    paths = sorted(p for p in folder.iterdir() if p.is_file())
    embed = Embed()
    async with Pipeline([ReadFile(), tokenize, embed], max_in_flight=32) as pipeline:
        reqs = [Doc(path=str(p)) for p in paths]
        results = await asyncio.gather(*(pipeline.run(r) for r in reqs),
                                       return_exceptions=True)

    print(f"embedded {len(paths)} files from {folder} in batches of {embed.batch_sizes}")
    ok = {}
    for path, req, res in zip(paths, reqs, results):
        if isinstance(res, PipelineError):        # only this file failed
            print(f"  {path.name:12s} error   {type(res).__name__}: {res}")
            continue
        ok[path.name] = res
        t = req.timings["embed"]
        print(f"  {path.name:12s} {len(req.words):3d} tokens  batch {req.batch}"
              f"  waited {t.waited * 1000:5.1f} ms  vector[:3] = "
              + ", ".join(f"{x:+.2f}" for x in res[:3]))

    print("nearest neighbours (cosine):")
    for name, v in ok.items():
        best = max((o for o in ok if o != name), key=lambda o: sum(a * b for a, b in zip(v, ok[o])))
        print(f"  {name:12s} -> {best}")

    # Streaming: Pipeline.stream yields the last stage's items as they are produced.
    async with Pipeline([ReadFile(), tokenize, Typewriter(), Shout()]) as pipeline:
        first = folder / "sea.txt" if (folder / "sea.txt").exists() else paths[0]
        print(f"streaming {first.name}:", end="")
        async for word in pipeline.stream(Doc(path=str(first))):
            print(" " + word, end="", flush=True)
        print()


if __name__ == "__main__":
    folder = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else _sample_folder()
    asyncio.run(main(folder))
