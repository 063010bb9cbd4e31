"""scripts/gpu_check.sh's CPU-side parts: it refuses to run without a CUDA device with one
JSON line and exit status 2, rejects bad arguments clearly, and its JSON line has the same
keys whatever ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mimo.bench.gpu_check import PHASES, parse_args, parse_pytest_summary, summarize

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
KEYS = {"ok", "device", "torch", "triton", "kernels", "model", "speed", "errors"}


def _run(*args):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)


def test_without_cuda_one_json_line_and_status_2():
    r = _run("--phases", "kernels")
    assert r.returncode == 2, r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(line) == KEYS and line["ok"] is False and line["device"] is None
    assert "no CUDA device" in line["errors"][0] and "Traceback" not in r.stderr
    assert all(line[p] is None for p in PHASES)


@pytest.mark.parametrize("args, message", [
    (["--streams", "1,x"], "comma-separated integers"),
    (["--streams", "0"], "integers >= 1"),
    (["--phases", "kernels,warp"], "phases are kernels, model, speed"),
    (["--prefill-tokens", "0"], "--prefill-tokens must be >= 1"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_arguments_are_refused_before_anything_runs(args, message):
    r = _run(*args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_help_lists_every_option():
    r = _run("--help")
    assert r.returncode == 0
    for flag in ("--phases", "--device", "--streams", "--decode-tokens", "--prompt-tokens",
                 "--prefill-tokens", "--pytest-timeout", "--pytest-log"):
        assert flag in r.stdout


def test_defaults_are_the_documented_run():
    a = parse_args([])
    assert a.phases == list(PHASES) and a.streams == [1, 64] and a.prefill_tokens == 16384
    assert parse_args(["--phases", "speed", "--streams", "2,8"]).streams == [2, 8]


def test_pytest_summary_counts():
    assert parse_pytest_summary("3 failed, 40 passed, 2 skipped, 1 error in 12.3s") == {
        "passed": 40, "failed": 3, "errors": 1, "skipped": 2}
    assert parse_pytest_summary("") == {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}


def test_summary_shape_and_verdict():
    info = {"device": "NVIDIA H200", "torch": "2.11", "triton": "3.6"}
    good = summarize(info, {"kernels": {"rc": 0, "passed": 5}, "speed": {"ok": True}}, [])
    assert set(good) == KEYS and good["ok"] is True and good["model"] is None
    assert summarize(info, {"kernels": {"rc": 1}}, [])["ok"] is False
    assert summarize(info, {"model": {"ok": False}}, [])["ok"] is False
    assert summarize(info, {}, ["speed: RuntimeError: x"])["ok"] is False
    json.dumps(good)        # one JSON line: everything in it serializable
