"""OpenAI-style chat messages -> the prompt text a model was trained on, via its Jinja chat
template, rendered the way transformers' `apply_chat_template` renders it (sandboxed Jinja,
trim_blocks + lstrip_blocks, the same globals and `tojson`), without importing transformers.

The template comes from the tokenizer (GGUF `tokenizer.chat_template`, or tokenizer_config.json /
chat_template.jinja of a Hugging Face directory). Gemma 3 files without one get Gemma 3's
official template.

Special tokens: the template decides them. Like transformers, the rendered text is encoded with
`add_special_tokens=False`, so a template that writes `{{ bos_token }}` (Gemma) gets exactly one
BOS, and one that writes none (SmolLM2, ChatML) gets none. `ChatPrompt.has_bos` says which.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
# Message keys besides role and content that templates read (OpenAI's tool turns).
_EXTRA_KEYS = ("tool_calls", "tool_call_id", "name")


class ChatTemplateError(ValueError):
    """A conversation that cannot be turned into a prompt."""


class InvalidMessages(ChatTemplateError):
    """The messages themselves are malformed (empty list, unknown role, non-string content)."""


class NoChatTemplate(ChatTemplateError):
    """The model has no chat template and none is built in for its architecture."""


class TemplateRejected(ChatTemplateError):
    """The template refused the conversation (`raise_exception`, e.g. roles not alternating)
    or failed while rendering it."""


# Gemma 3's chat template (google/gemma-3-*-it tokenizer_config.json), verbatim: the system
# message is folded into the first user turn, 'assistant' is spelled 'model'.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n")

BUILTIN_TEMPLATES = {"gemma3": GEMMA3_TEMPLATE}


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    has_bos: bool     # the text starts with the tokenizer's BOS token (the template wrote it)


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Plain copies {'role', 'content'} of OpenAI-style messages (plus an assistant's
    `tool_calls`, a tool result's `tool_call_id` and a `name`); InvalidMessages otherwise."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Iterable):
        raise InvalidMessages("messages must be a list of {'role': ..., 'content': ...} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidMessages(f"messages[{i}] is a {type(m).__name__}, not an object "
                                  f"with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise InvalidMessages(f"messages[{i}].role is {role!r}; supported roles: "
                                  f"{', '.join(ROLES)}")
        content = m.get("content")
        if not isinstance(content, str):
            raise InvalidMessages(f"messages[{i}].content must be a string, not "
                                  f"{type(content).__name__}")
        msg: dict[str, Any] = {"role": str.__str__(role), "content": str.__str__(content)}
        for k in _EXTRA_KEYS:
            if m.get(k) is not None:
                msg[k] = m[k]
        out.append(msg)
    if not out:
        raise InvalidMessages("messages is empty: a chat needs at least one message")
    return out


@functools.lru_cache(maxsize=16)
def _compile(source: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): the
        body renders as is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson HTML-escapes; transformers' does not.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class Namespace(jinja2.utils.Namespace):
        """As transformers: `namespace` objects refuse underscore names."""
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore attributes ({name!r}) on a namespace")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["namespace"] = Namespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the model's chat template does not parse: {e}") from e


class ChatTemplate:
    """A model's chat template bound to its special tokens."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None,
                 pad_token: str | None = None, origin: str = "tokenizer"):
        self.source = source
        self.origin = origin            # 'tokenizer' or 'built-in <arch>'
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        self._template = _compile(source)

    @classmethod
    def for_model(cls, tokenizer, arch: str | None = None) -> ChatTemplate:
        """The tokenizer's template, else the built-in one for `arch` (ModelConfig.arch)."""
        def token(i):
            return tokenizer.id_to_token(i) if i is not None else None

        source, origin = getattr(tokenizer, "chat_template", None), "tokenizer"
        if not source:
            if arch not in BUILTIN_TEMPLATES:
                raise NoChatTemplate(
                    f"this model has no chat template (none in its tokenizer and none built in "
                    f"for architecture {arch!r}); send a plain prompt instead of messages")
            source, origin = BUILTIN_TEMPLATES[arch], f"built-in {arch}"
        return cls(source, token(tokenizer.bos_token_id), token(tokenizer.eos_token_id),
                   token(getattr(tokenizer, "pad_token_id", None)), origin)

    @property
    def supports_tools(self) -> bool:
        """The template renders `tools` and tool turns itself (else callers fold them into
        plain messages: mimo.tools.prompt)."""
        return "tool_calls" in self.source or "tools" in self.source

    def render(self, messages, add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> ChatPrompt:
        import jinja2
        msgs = validate_messages(messages)
        special = {k: v for k, v in (("bos_token", self.bos_token), ("eos_token", self.eos_token),
                                     ("pad_token", self.pad_token)) if v is not None}
        try:
            text = self._template.render(messages=msgs, tools=tools or None, documents=None,
                                         add_generation_prompt=bool(add_generation_prompt),
                                         **special)
        except jinja2.exceptions.TemplateError as e:
            raise TemplateRejected(f"chat template rejected the conversation: {e}") from e
        except (TypeError, KeyError, IndexError, AttributeError) as e:
            raise TemplateRejected(f"chat template failed on these messages: "
                                   f"{type(e).__name__}: {e}") from e
        has_bos = bool(self.bos_token) and text.startswith(self.bos_token)
        return ChatPrompt(text, has_bos)

    def encode(self, tokenizer, messages, add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> list[int]:
        """Prompt token ids, as transformers' `apply_chat_template(tokenize=True)` gives them:
        the rendered text encoded with add_special_tokens=False (the template wrote any BOS)."""
        return tokenizer.encode(self.render(messages, add_generation_prompt, tools).text,
                                add_special_tokens=False)
