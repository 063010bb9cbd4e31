"""examples/custom_engine.py: an LLMEngine built in Python with a prefix cache of its own,
served through the real server (a process on 127.0.0.1) and driven by the official openai
client. The custom part is the one serving: its report line appears, and the repeated
prompt comes back with cached tokens."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from mimo.bench.server_process import ServerProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_engine.py"


@pytest.fixture(scope="module")
def served(tiny_hf_dir):
    d, _ = tiny_hf_dir
    s = ServerProcess(["--model", str(d), "--dtype", "float32", "--kv-cache-memory", "8MiB",
                       "--page-size", "4"], start_timeout=180, script=EXAMPLE)
    yield s
    s.stop()


def test_the_example_serves_with_its_own_prefix_cache(served):
    from openai import OpenAI
    client = OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    prompt = list(range(5, 45))
    first = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
    again = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
    assert first.choices[0].text == again.choices[0].text
    assert first.usage.prompt_tokens == again.usage.prompt_tokens == len(prompt)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    m = re.search(r"\[reporting-cache\] reused (\d+) of (\d+) prompt tokens", served.log_tail())
    assert m, served.log_tail()
    assert (int(m.group(1)), int(m.group(2))) == (cached, len(prompt))
    assert served.alive()
