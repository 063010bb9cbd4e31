"""Reading a request body: size cap (413), read deadline (408: a sender that stalls after
its first bytes holds no connection past it), UTF-8 and JSON, then one walk that refuses
lone surrogates anywhere (keys included): JSON may escape them ("\\ud800"), no tokenizer,
schema compiler or response encoder takes them."""
from __future__ import annotations

import asyncio
import json

from starlette.requests import ClientDisconnect

from .errors import BodyIncomplete, BodyTimeout, BodyTooLarge, bad_request


async def _read(request, max_bytes: int) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise BodyIncomplete() from None
    return b"".join(chunks)


def _ok(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _path(parts: list) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            p = p if _ok(p) else "<key>"
            out += f".{p}" if out else p
    return out


def check_unicode(body) -> None:
    """400 naming the top-level field of the first lone surrogate, in a key or a string."""
    stack: list[tuple[object, list]] = [(body, [])]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if not _ok(v):
                top = path[0] if path and isinstance(path[0], str) else None
                raise bad_request(f"{_path(path) or 'the body'} is not valid Unicode (lone "
                                  f"surrogate escape)", top)
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and not _ok(k):
                    top = path[0] if path and isinstance(path[0], str) else None
                    where = f"a key in {_path(path)}" if path else "a top-level key"
                    raise bad_request(f"{where} is not valid Unicode (lone surrogate escape)",
                                      top)
                stack.append((x, path + [k]))
        elif isinstance(v, list):
            stack.extend((x, path + [i]) for i, x in enumerate(v))


async def read_bytes(request, max_bytes: int, timeout: float) -> bytes:
    """The raw body, under the same size cap (413) and read deadline (408) as JSON bodies."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(max_bytes)
    try:
        return await asyncio.wait_for(_read(request, max_bytes), timeout)
    except asyncio.TimeoutError:
        raise BodyTimeout(timeout) from None


async def read_json(request, max_bytes: int, timeout: float) -> object:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(max_bytes)
    try:
        raw = await asyncio.wait_for(_read(request, max_bytes), timeout)
    except asyncio.TimeoutError:
        raise BodyTimeout(timeout) from None
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e.msg} at line {e.lineno} "
                          f"column {e.colno}") from None
    except RecursionError:
        raise bad_request("request body is not valid JSON: nested too deeply") from None
    except ValueError as e:     # e.g. an integer literal over Python's 4300-digit limit
        raise bad_request(f"request body is not valid JSON: {str(e)[:200]}") from None
    check_unicode(body)
    return body
