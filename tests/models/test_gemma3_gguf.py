"""The embedded default model (Gemma 3 270M GGUF) against transformers' Gemma3ForCausalLM
loaded from the same GGUF, both float32: identical greedy tokens, batched, with one prompt
far past the 512-token window."""
import argparse
import collections
import inspect
import json

import pytest
import torch

from mimo import SamplingParams

STEPS = 24
MARGIN = 0.05


def _long_text() -> str:
    """Real English prose well past 1,200 tokens, from the standard library's own docs."""
    parts = [inspect.getdoc(m) or "" for m in (argparse, collections, json)]
    parts += [inspect.getdoc(o) or "" for o in (argparse.ArgumentParser.add_argument,
                                                  collections.OrderedDict, json.dumps, json.loads)]
    return "\n\n".join(parts)


def _prompts() -> list[str]:
    return [
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "The following is a list of the planets of the solar system in order from the Sun: "
        "Mercury, Venus,",
        "import numpy as np\nimport matplotlib.pyplot as plt\n\nx = np.linspace(0, 10, 100)\n",
        # ~2,600 tokens: the answer sits 2,500 tokens back, far outside every SWA layer's
        # window, so only correct full-layer KV can recall it.
        "The secret password is BLUE-HORSE-42. Remember it.\n\n" + _long_text()
        + "\n\nQuestion: What is the secret password?\nAnswer: The secret password is",
    ]


@pytest.fixture(scope="module")
def reference(gemma_loaded):
    from transformers import AutoModelForCausalLM
    path = gemma_loaded.source
    model = AutoModelForCausalLM.from_pretrained(str(path.rsplit("/", 1)[0]),
                                                 gguf_file=path.rsplit("/", 1)[1], dtype=torch.float32)
    return model.eval()


def _reference_greedy(model, ids):
    """Greedy tokens and the top-2 logit margin at each step."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0)
    tokens = out.sequences[0, len(ids):].tolist()
    margins = []
    for logits in out.logits:
        top2 = torch.topk(logits[0].float(), 2).values
        margins.append(float(top2[0] - top2[1]))
    return tokens, margins


def test_greedy_tokens_match_transformers(gemma_fp32, reference):
    tok = gemma_fp32.tokenizer
    ids = [tok.encode(p) for p in _prompts()]
    assert len(ids[3]) > 1200, "the long prompt must be well past the 512-token window"
    outs = gemma_fp32.generate([{"prompt_token_ids": i} for i in ids],
                               SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    compared = 0
    for i, (pid, out) in enumerate(zip(ids, outs)):
        ref, margins = _reference_greedy(reference, pid)
        # Compare up to the first step the reference itself calls a near-tie.
        n = next((k for k, m in enumerate(margins) if m < MARGIN), STEPS)
        assert out.token_ids[:n] == ref[:n], (
            f"prompt {i}: ours {out.token_ids} vs transformers {ref} (compared {n} steps)")
        compared += n
    assert compared >= 3 * STEPS, f"only {compared} steps were decisive enough to compare"



DEFAULT_MARGIN = 0.1


def _agree(llm, reference, margin, rows_at_once):
    """Greedy tokens of every prompt (all at once, or one by one) against the reference up
    to its first step with a top-2 margin below `margin`; returns the steps compared."""
    ids = [llm.tokenizer.encode(p) for p in _prompts()]
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    if rows_at_once:
        outs = llm.generate([{"prompt_token_ids": i} for i in ids], params)
    else:
        outs = [llm.generate({"prompt_token_ids": i}, params)[0] for i in ids]
    compared = 0
    for i, (pid, out) in enumerate(zip(ids, outs)):
        ref, margins = _reference_greedy(reference, pid)
        n = next((k for k, m in enumerate(margins) if m < margin), STEPS)
        assert out.token_ids[:n] == ref[:n], (
            f"prompt {i}: ours {out.token_ids} vs transformers {ref} ({n} steps)")
        compared += n
    return compared


def test_compiled_bf16_agrees_with_transformers(gemma_loaded, reference):
    """bfloat16 with compiled prefill layers and the float32 residual stream, bf16 weights
    (--quantize none): the float32 reference's greedy tokens up to its first step with a
    top-2 margin below 0.1, batched and one prompt at a time."""
    from mimo import LLM
    llm = LLM("gemma-3-270m", progress=False, loaded=gemma_loaded, compile="on",
              quantize="none", kv_cache_memory="256MiB")
    assert llm.engine.model._compiled is not None
    assert _agree(llm, reference, DEFAULT_MARGIN, True) >= 2 * STEPS
    assert _agree(llm, reference, DEFAULT_MARGIN, False) >= 2 * STEPS
    llm.engine.check_integrity()


def test_int4_screened_head_picks_the_exact_tokens(gemma_loaded):
    """The default runtime's int4-screened greedy head against the same engine with the
    proven-exact int8 argmax: identical tokens for every prompt, alone (one row: the int4
    path) and batched, through 24 steps, near-ties included."""
    from mimo import LLM
    llm = LLM("gemma-3-270m", progress=False, loaded=gemma_loaded, compile="off",
              kv_cache_memory="256MiB")
    head = llm.engine.model.lm_head
    assert llm.engine.config.runtime.use_int4_head and head._int4 is not None
    ids = [llm.tokenizer.encode(p) for p in _prompts()] + [[2, 818, 5279, 529, 7001, 563]]
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)

    def run():
        one = [llm.generate({"prompt_token_ids": i}, params)[0].token_ids for i in ids]
        return one, [o.token_ids for o in llm.generate([{"prompt_token_ids": i} for i in ids], params)]
    screened = run()
    int4, head._int4 = head._int4, None
    try:
        exact = run()
    finally:
        head._int4 = int4
    assert screened == exact
    llm.engine.check_integrity()
