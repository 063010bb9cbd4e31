"""Responses input items: checked and normalized into the stored item shapes (each with an
id, as `input_items` lists them), then a chain's items -> chat messages for the chat
pipeline.

Items taken: `message` (roles user, system, developer, assistant; content a string or
input_text / input_image parts, output_text / refusal for the assistant), `function_call`,
`function_call_output` (its call_id must answer a function_call earlier in the chain or the
same input) and `reasoning`. A reasoning item is kept in the chain and listed, but like chat's
`reasoning_content` on assistant messages it is not rendered into the prompt. Any other item
type is a 400 naming it. Errors name `input` and the item's index.
"""
from __future__ import annotations

import json
import uuid

from ..errors import bad_request
from ..fields import kind_of

MAX_ITEMS = 4096
ROLES = ("user", "system", "developer", "assistant")
P = "input"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(v, where: str) -> str:
    if not isinstance(v, str):
        raise bad_request(f"'{where}' must be a string, got {kind_of(v)}", P)
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"'{where}' is not valid Unicode (lone surrogate escape)", P) from None
    return v


def _opt_id(item: dict, where: str, prefix: str) -> str:
    rid = item.get("id")
    return new_id(prefix) if rid is None else _text(rid, f"{where}.id")


def _part(p, where: str, assistant: bool) -> dict:
    if not isinstance(p, dict):
        raise bad_request(f"'{where}' must be an object, got {kind_of(p)}", P)
    t = p.get("type")
    if assistant and t in ("output_text", "input_text"):
        return {"type": "output_text", "text": _text(p.get("text"), f"{where}.text"),
                "annotations": []}
    if assistant and t == "refusal":
        return {"type": "refusal", "refusal": _text(p.get("refusal"), f"{where}.refusal")}
    if not assistant and t == "input_text":
        return {"type": "input_text", "text": _text(p.get("text"), f"{where}.text")}
    if not assistant and t == "input_image":
        url = p.get("image_url")
        if url is None:
            raise bad_request(f"'{where}.image_url' is required (file_id is not supported)", P)
        detail = p.get("detail", "auto")
        if detail not in ("auto", "low", "high"):
            raise bad_request(f"'{where}.detail' must be 'auto', 'low' or 'high'", P)
        return {"type": "input_image", "image_url": _text(url, f"{where}.image_url"),
                "detail": detail}
    allowed = "output_text, refusal" if assistant else "input_text, input_image"
    shown = t[:40] if isinstance(t, str) else kind_of(t)
    raise bad_request(f"'{where}.type' {shown!r} is not supported here; allowed: {allowed}", P)


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ROLES:
        shown = role[:40] if isinstance(role, str) else kind_of(role)
        raise bad_request(f"'{where}.role' {shown!r} is not one of {', '.join(ROLES)}", P)
    assistant = role == "assistant"
    content = item.get("content")
    if isinstance(content, str):
        content = [{"type": "output_text" if assistant else "input_text", "text": content}]
    if not isinstance(content, list) or not content:
        raise bad_request(f"'{where}.content' must be a string or a non-empty array of "
                          f"parts", P)
    parts = [_part(p, f"{where}.content[{j}]", assistant) for j, p in enumerate(content)]
    return {"id": _opt_id(item, where, "msg"), "type": "message", "role": role,
            "status": "completed", "content": parts}


def _function_call(item: dict, where: str) -> dict:
    args = _text(item.get("arguments"), f"{where}.arguments")
    try:
        json.loads(args)
    except ValueError:
        raise bad_request(f"'{where}.arguments' is not valid JSON", P) from None
    name = _text(item.get("name"), f"{where}.name")
    call_id = _text(item.get("call_id"), f"{where}.call_id")
    if not name or not call_id:
        raise bad_request(f"'{where}' needs a non-empty name and call_id", P)
    return {"id": _opt_id(item, where, "fc"), "type": "function_call", "call_id": call_id,
            "name": name, "arguments": args, "status": "completed"}


def _output_text(v, where: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and v and all(isinstance(p, dict) and p.get("type") == "input_text"
                                         for p in v):
        return "".join(_text(p.get("text"), f"{where}[{j}].text") for j, p in enumerate(v))
    raise bad_request(f"'{where}' must be a string or an array of input_text parts, got "
                      f"{kind_of(v)}", P)


def _call_output(item: dict, where: str) -> dict:
    call_id = _text(item.get("call_id"), f"{where}.call_id")
    out = _output_text(item.get("output"), f"{where}.output")
    return {"id": _opt_id(item, where, "fco"), "type": "function_call_output",
            "call_id": call_id, "output": out, "status": "completed"}


def _reasoning(item: dict, where: str) -> dict:
    if item.get("encrypted_content") is not None:
        raise bad_request(f"'{where}.encrypted_content' is not supported (this server does "
                          f"not encrypt reasoning)", P)
    summary, content = item.get("summary", []), item.get("content") or []
    if not isinstance(summary, list) or not isinstance(content, list):
        raise bad_request(f"'{where}.summary' and '.content' must be arrays", P)
    for j, s in enumerate(summary):
        if not isinstance(s, dict) or s.get("type") != "summary_text":
            raise bad_request(f"'{where}.summary[{j}]' must be a summary_text part", P)
        _text(s.get("text"), f"{where}.summary[{j}].text")
    for j, c in enumerate(content):
        if not isinstance(c, dict) or c.get("type") != "reasoning_text":
            raise bad_request(f"'{where}.content[{j}]' must be a reasoning_text part", P)
        _text(c.get("text"), f"{where}.content[{j}].text")
    return {"id": _opt_id(item, where, "rs"), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": s["text"]} for s in summary],
            "content": [{"type": "reasoning_text", "text": c["text"]} for c in content],
            "status": "completed"}


_KINDS = {"message": _message, "function_call": _function_call,
          "function_call_output": _call_output, "reasoning": _reasoning}


def parse_input(v) -> list[dict]:
    """`input` (a string, or an array of items) -> normalized items."""
    if isinstance(v, str):
        if not v:
            raise bad_request("'input' is empty", P)
        v = [{"type": "message", "role": "user", "content": v}]
    if not isinstance(v, list) or not v:
        raise bad_request(f"'input' must be a non-empty string or array of items, got "
                          f"{kind_of(v) if not isinstance(v, list) else 'an empty array'}", P)
    if len(v) > MAX_ITEMS:
        raise bad_request(f"'input' has {len(v)} items; at most {MAX_ITEMS}", P)
    out = []
    for i, item in enumerate(v):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"'{where}' must be an object, got {kind_of(item)}", P)
        t = item.get("type", "message" if "role" in item else None)
        kind = _KINDS.get(t) if isinstance(t, str) else None
        if kind is None:
            shown = t[:40] if isinstance(t, str) else kind_of(t)
            raise bad_request(f"'{where}.type' {shown!r} is not supported; this server takes "
                              f"{', '.join(_KINDS)} items", P)
        out.append(kind(item, where))
    return out


def check_call_outputs(context: list[dict], items: list[dict]) -> None:
    """Each function_call_output answers a function_call before it in the chain."""
    seen = {it["call_id"] for it in context if it["type"] == "function_call"}
    for i, it in enumerate(items):
        if it["type"] == "function_call":
            seen.add(it["call_id"])
        elif it["type"] == "function_call_output" and it["call_id"] not in seen:
            raise bad_request(f"'input[{i}]': no function_call with call_id "
                              f"{it['call_id'][:64]!r} before this function_call_output", P,
                              "invalid_function_call_output")


def _chat_content(item: dict):
    parts = item["content"]
    if item["role"] == "assistant":
        return "".join(p.get("text", p.get("refusal", "")) for p in parts)
    if all(p["type"] == "input_text" for p in parts):
        return "".join(p["text"] for p in parts)
    return [{"type": "text", "text": p["text"]} if p["type"] == "input_text" else
            {"type": "image_url", "image_url": {"url": p["image_url"], "detail": p["detail"]}}
            for p in parts]


def to_messages(instructions: str | None, items: list[dict]) -> list[dict]:
    """Chat messages for `items` (normalized). The assistant's items between two other
    messages (text, function calls, in any order: a call written inside the thinking block
    comes before the text) become one assistant message, its text then its tool_calls, as
    chat completions answers the same output."""
    msgs: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    for it in items:
        t = it["type"]
        last = msgs[-1] if msgs else None
        if t == "message" and it["role"] == "assistant" and last is not None \
                and last["role"] == "assistant":
            last["content"] = (last["content"] or "") + _chat_content(it)
        elif t == "message":
            role = "system" if it["role"] == "developer" else it["role"]
            msgs.append({"role": role, "content": _chat_content(it)})
        elif t == "function_call":
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif t == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
    return msgs
