"""Tools and tool turns as plain chat messages, for a chat template that knows neither
(Gemma 3's official template: user/model turns only, strictly alternating). The tool list and
the call format go into the system message; an assistant's calls become its text in the
family's format; tool results become a user turn of <tool_response> blocks; consecutive
turns of one role are merged, so the template's alternation rule holds."""
from __future__ import annotations

import json

from .formats import ToolFormat

INSTRUCTIONS = ("You may call functions. The available functions, as JSON schemas:\n{tools}\n"
                "To call one, answer with exactly\n{example}\nand nothing else.")


def fold_tools(messages: list[dict], tools: list[dict] | None, fmt: ToolFormat) -> list[dict]:
    out: list[dict] = []

    def add(role: str, text: str) -> None:
        if out and out[-1]["role"] == role:
            out[-1] = {"role": role, "content": out[-1]["content"] + "\n\n" + text}
        else:
            out.append({"role": role, "content": text})

    if tools:
        desc = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        add("system", INSTRUCTIONS.format(tools=desc, example=fmt.write("NAME", {"ARG": "VALUE"})))
    for m in messages:
        role, text = m["role"], m.get("content") or ""
        if not isinstance(text, str):           # media parts: kept as they are
            out.append(m)
        elif role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(fmt.write(c["function"]["name"], c["function"]["arguments"])
                              for c in m["tool_calls"])
            add("assistant", (text + "\n" if text else "") + calls)
        elif role in ("tool", "function"):
            add("user", f"<tool_response>\n{text}\n</tool_response>")
        else:
            add(role, text)
    return out
