"""Chat messages of an OpenAI body -> template-ready dicts. Every role OpenAI defines is
taken: system / developer (as system), user, assistant (text and/or `tool_calls`, or the
legacy `function_call`), tool (a result, with its `tool_call_id`) and the legacy function.
Any error names `messages` as its param and says which message and field."""
from __future__ import annotations

import json

from ..multimodal.item import MediaItem
from .content import parse_content
from .errors import bad_request
from .fields import kind_of, string

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _text_only(content, i: int, role: str, multimodal: bool) -> str:
    out = parse_content(content, i, role, multimodal, [])
    assert isinstance(out, str)      # media parts are refused outside user messages
    return out


def _arguments(v, where: str):
    """A call's `arguments`: OpenAI sends a JSON string; templates want the object."""
    if isinstance(v, dict):
        return v
    if not isinstance(v, str):
        raise bad_request(f"{where} must be a JSON string, got {kind_of(v)}", "messages")
    try:
        return json.loads(v) if v.strip() else {}
    except ValueError:
        raise bad_request(f"{where} is not valid JSON", "messages") from None


def _call(c, where: str) -> dict:
    if not isinstance(c, dict):
        raise bad_request(f"{where} must be an object, got {kind_of(c)}", "messages")
    if c.get("type", "function") != "function":
        raise bad_request(f"{where}.type must be 'function', got {c.get('type')!r}", "messages")
    fn = c.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"{where}.function must be an object", "messages")
    name = string(fn, "name", where=f"{where}.function.name", param="messages", nonempty=True)
    if name is None:
        raise bad_request(f"{where}.function.name is required", "messages")
    cid = string(c, "id", where=f"{where}.id", param="messages") or ""
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": _arguments(fn.get("arguments", "{}"),
                                                                f"{where}.function.arguments")}}


def parse_messages(msgs, multimodal: bool, media: list[MediaItem]) -> list[dict]:
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object, got {kind_of(m)}", "messages")
        role = m.get("role")
        if role not in ROLES:
            shown = role if isinstance(role, str) else kind_of(role)
            raise bad_request(f"messages[{i}].role {shown!r} is not one of "
                              f"{', '.join(ROLES)}", "messages")
        name = string(m, "name", where=f"messages[{i}].name", param="messages")
        msg: dict = {"role": "system" if role == "developer" else role}
        if name:
            msg["name"] = name
        content = m.get("content")
        if isinstance(content, list) and not content:
            raise bad_request(f"messages[{i}].content is an empty array", "messages")
        if role == "assistant":
            calls = m.get("tool_calls")
            if m.get("function_call") is not None and calls is None:
                fc = m["function_call"]
                calls = [{"type": "function", "id": "", "function": fc}]
            if calls is not None:
                if not isinstance(calls, list) or not calls:
                    raise bad_request(f"messages[{i}].tool_calls must be a non-empty array",
                                      "messages")
                msg["tool_calls"] = [_call(c, f"messages[{i}].tool_calls[{j}]")
                                     for j, c in enumerate(calls)]
            if content is None:
                if calls is None:
                    raise bad_request(f"messages[{i}].content is required (or tool_calls)",
                                      "messages")
                content = ""
            msg["content"] = _text_only(content, i, role, multimodal)
        elif role in ("tool", "function"):
            if role == "tool":
                tid = string(m, "tool_call_id", where=f"messages[{i}].tool_call_id",
                             param="messages")
                if tid is None:
                    raise bad_request(f"messages[{i}].tool_call_id is required for a tool "
                                      f"message", "messages")
                msg["tool_call_id"] = tid
            elif not name:
                raise bad_request(f"messages[{i}].name is required for a function message",
                                  "messages")
            msg["content"] = _text_only(content, i, role, multimodal)
        else:
            msg["content"] = parse_content(content, i, msg["role"], multimodal, media)
        out.append(msg)
    return out


__all__ = ["ROLES", "parse_messages"]
