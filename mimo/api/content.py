"""OpenAI chat content parts -> template-ready content plus the request's media items.

A message's content is a string or a list of parts: `text`, `image_url` and `video_url`.
Media parts become `{"type": "image"}` / `{"type": "video"}` markers in the content (the
tokenize stage turns each into the model's placeholder) and a `MediaItem` in prompt order;
the fetch stage, not this module, decides whether a URL is allowed (scheme, address, path),
so those refusals carry the fetch layer's precise reason.
"""
from __future__ import annotations

import math
from typing import Any

from ..multimodal.item import MediaItem
from .errors import bad_request

MEDIA_PARTS = {"image_url": "image", "video_url": "video"}
MAX_URL_CHARS = 16 * 2**20        # a data: URL is the only long one; the body limit binds first


def valid_unicode(s: str, where: str, param: str = "messages") -> str:
    """JSON may carry lone surrogate escapes ("\\ud800"); they are not text a tokenizer takes."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{where} is not valid Unicode (lone surrogate escape)",
                          param) from None
    return s


def _opt_num(spec: dict, name: str, where: str, integer: bool):
    v = spec.get(name)
    if v is None:
        return None
    ok = not isinstance(v, bool) and isinstance(v, int if integer else (int, float))
    if not ok or (isinstance(v, float) and not math.isfinite(v)) or v <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise bad_request(f"{where}.{name} must be {kind}, got {v!r}", "messages")
    return v


def _media(part: dict, kind_key: str, where: str) -> MediaItem:
    kind = MEDIA_PARTS[kind_key]
    spec = part.get(kind_key)
    if isinstance(spec, str):          # some clients send the URL directly
        spec = {"url": spec}
    if not isinstance(spec, dict):
        raise bad_request(f"{where}.{kind_key} must be an object like {{\"url\": \"...\"}}",
                          "messages")
    url = spec.get("url")
    if not isinstance(url, str) or not url.strip():
        raise bad_request(f"{where}.{kind_key}.url is missing (a http(s), data: or file URL)",
                          "messages")
    if len(url) > MAX_URL_CHARS:
        raise bad_request(f"{where}.{kind_key}.url is over {MAX_URL_CHARS} characters", "messages")
    valid_unicode(url, f"{where}.{kind_key}.url")
    if kind == "image":
        return MediaItem("image", url.strip())
    return MediaItem("video", url.strip(), fps=_opt_num(spec, "fps", f"{where}.video_url", False),
                     max_frames=_opt_num(spec, "max_frames", f"{where}.video_url", True))


def parse_content(content: Any, i: int, role: str, multimodal: bool,
                  media: list[MediaItem]) -> str | list[dict]:
    """messages[i].content -> a string, or a list of {"type": "text"|"image"|"video"} parts
    when it holds media (appended to `media` in order)."""
    if isinstance(content, str):
        return valid_unicode(content, f"messages[{i}].content")
    if not isinstance(content, list):
        raise bad_request(f"messages[{i}].content must be a string or a list of content parts",
                          "messages")
    parts: list[dict] = []
    for j, p in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "text":
            if not isinstance(p.get("text"), str):
                raise bad_request(f"{where}.text must be a string", "messages")
            parts.append({"type": "text", "text": valid_unicode(p["text"], where)})
        elif kind in MEDIA_PARTS:
            if not multimodal:
                raise bad_request(f"{where}: this model is text-only and takes no "
                                  f"{MEDIA_PARTS[kind]}s ({kind!r} parts)", "messages",
                                  "unsupported_content")
            if role != "user":
                raise bad_request(f"{where}: {kind!r} parts are accepted in user messages "
                                  f"only, not in {role!r} ones", "messages")
            media.append(_media(p, kind, where))
            parts.append({"type": MEDIA_PARTS[kind]})
        else:
            shown = kind if isinstance(p, dict) else type(p).__name__
            allowed = "'text', 'image_url', 'video_url'" if multimodal else "'text'"
            raise bad_request(f"{where}: unsupported content part {shown!r} (this model "
                              f"takes {allowed} parts)", "messages", "unsupported_content")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts
