"""The first chat in the README (and docs/first_chat.md), run as written: the server `serve.sh` starts (its
own flags, read from the script) answers the doc's curl request sensibly. The reference is
a fact, not mimo's output: the capital of France is Paris."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import httpx
from helpers.api_server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]


def serve_sh_flags() -> list[str]:
    """The flags serve.sh passes to server.py before the user's ("$@")."""
    m = re.search(r'^exec python server\.py (.*) "\$@"$', (ROOT / "serve.sh").read_text(), re.M)
    assert m, "serve.sh no longer ends in: exec python server.py FLAGS \"$@\""
    return shlex.split(m.group(1))


def first_chat_request(doc_path: str) -> tuple[str, dict]:
    """The path and JSON body of the doc's first curl to /v1/chat/completions."""
    doc = (ROOT / doc_path).read_text()
    cmd = next(b for b in re.findall(r"```bash\n(.*?)```", doc, re.S)
               if "/v1/chat/completions" in b and "curl" in b)
    words = shlex.split(cmd.replace("\\\n", " "))
    words = words[words.index("curl"):]
    url = next(w for w in words if w.startswith("http://127.0.0.1:8000/"))
    body = json.loads(words[words.index("-d") + 1])
    return url.removeprefix("http://127.0.0.1:8000"), body


def test_the_readmes_first_chat_answers_sensibly():
    flags = serve_sh_flags()
    path, body = first_chat_request("README.md")
    assert (path, body) == first_chat_request("docs/first_chat.md")     # one request, twice
    assert path == "/v1/chat/completions"
    assert body["model"] == flags[flags.index("--model") + 1]      # the model serve.sh serves
    server = ServerProcess(*flags)
    try:
        r = httpx.post(server.url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()["choices"][0]
        assert answer["finish_reason"] == "stop"       # a whole answer, not cut at max_tokens
        assert "Paris" in answer["message"]["content"]
        assert len(answer["message"]["content"]) < 100, answer
    finally:
        server.stop()
