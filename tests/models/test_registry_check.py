"""A built-in model's file check (the gemma package hashes its file at every call) runs on a
thread beside the load; the load returns only once it passed, and a check that fails is the
error raised, also where the load itself failed."""
import threading
import time

import pytest

from mimo.models import registry


def test_the_builtin_check_is_left_to_the_caller_and_names_the_same_file():
    checks: list = []
    path = registry.resolve("gemma-3-270m", checks)
    assert len(checks) == 1
    assert checks[0]() == path == registry.resolve("gemma-3-270m")


def _builtin(monkeypatch, path, check):
    def fake(checks=None):
        assert checks is not None, "load takes the checks to run them itself"
        checks.append(check)
        return path
    monkeypatch.setitem(registry.BUILTIN, "checked", fake)


def _mismatch():
    raise FileExistsError("unexpected sha256")


def test_a_failed_check_fails_the_load(monkeypatch, tiny_hf_dir):
    _builtin(monkeypatch, tiny_hf_dir[0], _mismatch)
    with pytest.raises(FileExistsError, match="unexpected sha256"):
        registry.load("checked", progress=False)


def test_a_failed_check_explains_a_failed_load(monkeypatch, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    _builtin(monkeypatch, bad, _mismatch)
    with pytest.raises(FileExistsError, match="unexpected sha256"):
        registry.load("checked", progress=False)
    monkeypatch.setitem(registry.BUILTIN, "plain", lambda checks=None: bad)
    with pytest.raises(ValueError, match="not a GGUF file"):       # the load's own error
        registry.load("plain", progress=False)


def test_the_load_runs_the_check_beside_and_waits_for_it(monkeypatch, tiny_hf_dir):
    ran: dict = {}

    def slow_check():
        ran["thread"] = threading.current_thread() is not threading.main_thread()
        time.sleep(0.5)
        ran["done"] = True
    _builtin(monkeypatch, tiny_hf_dir[0], slow_check)
    loaded = registry.load("checked", progress=False)
    assert ran == {"thread": True, "done": True} and loaded.config.arch == "gemma3"
