"""examples/image_qa.py and video_qa.py run against the tiny Qwen2.5-VL: in-process
(--model) and through a running server (--url); both print an answer and exit 0."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.api_server import ROOT
from helpers.media import media_path

RUNS = [("image_qa.py", "rocket.jpg"), ("video_qa.py", "nasa_13013.mp4")]


def run(script, *args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


@pytest.mark.parametrize("script,name", RUNS, ids=[r[0] for r in RUNS])
def test_in_process(script, name, vlm_dir):
    p = run(script, str(media_path(name)), "What is it?", "--model", str(vlm_dir),
            "--dtype", "float32", "--max-tokens", "4")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() or p.stdout == "\n"       # random weights: any text, one line


@pytest.mark.parametrize("script,name", RUNS, ids=[r[0] for r in RUNS])
def test_against_the_server(script, name, vlm_server, vlm_dir):
    p = run(script, str(media_path(name)), "What is it?", "--url", vlm_server.url + "/v1",
            "--max-tokens", "4")
    assert p.returncode == 0, p.stderr[-2000:]


def test_missing_file_is_a_clear_error(vlm_dir, tmp_path):
    p = run("image_qa.py", str(tmp_path / "absent.png"), "What?", "--model", str(vlm_dir))
    assert p.returncode != 0
    assert "absent.png" in p.stderr
