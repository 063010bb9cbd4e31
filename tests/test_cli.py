"""`python -m mimo generate` and `python -m mimo.bench generate` as a user runs them."""
import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def test_generate_from_the_command_line(tiny_hf_dir):
    d, _ = tiny_hf_dir
    r = _run("-m", "mimo", "generate", "hello world", "--model", str(d), "--max-tokens", "5",
             "--dtype", "float32", "--kv-cache-memory", "8MiB")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("hello world")
    assert "5 tokens in" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--kv-cache-memory", "lots"], "cannot parse size"),
    (["--max-tokens", "0"], "max_tokens must be >= 1"),
])
def test_generate_errors_are_one_clear_line(tiny_hf_dir, args, message):
    d, _ = tiny_hf_dir
    base = ["-m", "mimo", "generate", "hi", "--model", str(d), "--dtype", "float32"]
    r = _run(*base, *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_help_documents_every_engine_flag():
    r = _run("-m", "mimo", "generate", "--help")
    assert r.returncode == 0
    for flag in ("--model", "--dtype", "--quantize", "--kv-cache-memory", "--page-size",
                 "--swa-share", "--max-num-seqs", "--max-num-batched-tokens",
                 "--max-mixed-batched-tokens", "--max-model-len",
                 "--threads", "--device", "--temperature", "--top-p", "--top-k", "--seed",
                 "--attention-backend", "--decode-graphs"):
        assert flag in r.stdout


def test_generate_bench_runs_and_ends_with_one_json_line(tiny_hf_dir):
    d, _ = tiny_hf_dir
    r = _run("-m", "mimo.bench", "generate", "--model", str(d), "--streams", "1,2",
             "--prompt-tokens", "24", "--max-tokens", "6", "--peers", "none", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out["mimo"]) == {"1", "2"}
    assert all(v["decode_tps"] > 0 and v["e2e_tps"] > 0 for v in out["mimo"].values())
    assert "[generate]" in r.stderr


def test_server_help_documents_every_flag():
    r = _run("server.py", "--help")
    assert r.returncode == 0
    for flag in ("--host", "--port", "--api-key", "--served-model-name", "--max-body-bytes",
                 "--max-in-flight", "--max-queued", "--log-level", "--model", "--dtype",
                 "--kv-cache-memory", "--policy", "--aging-per-second", "--length-buckets",
                 "--max-num-batched-tokens", "--max-mixed-batched-tokens"):
        assert flag in r.stdout
    assert "127.0.0.1" in r.stdout and "8000" in r.stdout


def test_server_refuses_bad_flags_clearly():
    r = _run("server.py", "--model", "no-such-model")
    assert r.returncode == 2 and "unknown model" in r.stderr and "Traceback" not in r.stderr
