"""What image_qa.py and video_qa.py share: one user message (a media part + a question),
answered in-process through the server's own pipeline (--model) or by a running server
through the official openai client (--url)."""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout


def parse_args(doc: str, kind: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc)
    p.add_argument(kind, help=f"{kind} file path or http(s)/data: URL")
    p.add_argument("question")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", help="checkpoint directory: run in this process")
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--served-model", default=None, help="model id for --url (default: the first listed)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", default=None, help="--model only: e.g. float32")
    return p.parse_args()


def message(kind: str, url: str, question: str) -> list[dict]:
    part = {"type": f"{kind}_url", f"{kind}_url": {"url": url}}
    return [{"role": "user", "content": [part, {"type": "text", "text": question}]}]


async def ask_local(model: str, kind: str, path: str, question: str, max_tokens: int,
                    dtype: str | None = None) -> str:
    """The server's pipeline without HTTP: same parsing, stages and engine."""
    from mimo.api import schemas
    from mimo.api.chat_pipeline import build_chat_pipeline, chat_request
    from mimo.config import ServerConfig
    from mimo.engine.async_engine import AsyncEngine
    from mimo.engine.engine import LLMEngine
    from mimo.llm import engine_config
    from mimo.multimodal.config import MediaConfig
    local = pathlib.Path(path).expanduser()
    media = MediaConfig(allowed_media_dirs=(str(local.resolve().parent),) if local.exists() else ())
    url = str(local.resolve()) if local.exists() else path
    opts = {"dtype": dtype} if dtype else {}
    engine = AsyncEngine(LLMEngine(engine_config(model, **opts), progress=False))
    chat = build_chat_pipeline(ServerConfig(), engine, media)
    body = {"model": "local", "messages": message(kind, url, question), "max_tokens": max_tokens,
            "temperature": 0}
    spec = schemas.parse("chat", body, engine.info.max_model_len, multimodal=chat.multimodal)
    engine.start()
    try:
        out = await chat.pipeline.run(chat_request(spec))
    finally:
        await chat.pipeline.close(timeout=1.0)
        await engine.stop()
    return "".join(delta for delta, _ in out)


def ask_server(base_url: str, model: str | None, kind: str, path: str, question: str,
               max_tokens: int) -> str:
    from openai import OpenAI
    client = OpenAI(base_url=base_url, api_key="none")
    model = model or client.models.list().data[0].id
    local = pathlib.Path(path).expanduser()
    url = local.resolve().as_uri() if local.exists() else path   # the server reads the file
    r = client.chat.completions.create(model=model, messages=message(kind, url, question),
                                       max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content


def main(doc: str, kind: str) -> int:
    a = parse_args(doc, kind)
    path = getattr(a, kind)
    if "://" not in path and not path.startswith("data:") and not pathlib.Path(path).exists():
        print(f"error: no such {kind} file: {path}", file=sys.stderr)
        return 2
    from mimo.pipeline import PipelineError
    try:
        if a.model:
            text = asyncio.run(ask_local(a.model, kind, path, a.question, a.max_tokens, a.dtype))
        else:
            text = ask_server(a.url, a.served_model, kind, path, a.question, a.max_tokens)
    except PipelineError as e:      # bad media or prompt: the same message the server sends
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(text)
    return 0
