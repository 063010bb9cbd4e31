"""`python server.py --gather-wait SECONDS`: how long an idle engine waits for requests still
being tokenized. The value reaches the AsyncEngine the server builds; a negative, infinite,
NaN or non-numeric value is refused (ServerConfig, or the parser) before any model loads."""
from __future__ import annotations

import pytest

import server
from mimo.engine.async_engine import AsyncEngine


def _never_build(monkeypatch) -> list:
    built = []
    monkeypatch.setattr(AsyncEngine, "build", staticmethod(lambda *a, **k: built.append(1)))
    return built


@pytest.mark.parametrize("bad", ["-1", "-0.001", "nan", "inf"])
def test_bad_gather_wait_is_refused_before_the_engine(bad, tiny_hf_dir, monkeypatch, capsys):
    built = _never_build(monkeypatch)
    assert server.main(["--model", str(tiny_hf_dir[0]), "--gather-wait", bad]) == 2
    err = capsys.readouterr().err
    assert "gather_wait" in err and bad in err
    assert built == []


def test_non_numeric_gather_wait_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        server.build_parser().parse_args(["--gather-wait", "soon"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--gather-wait" in err and "soon" in err


@pytest.mark.parametrize("argv, expected", [([], 0.02), (["--gather-wait", "0"], 0.0),
                                            (["--gather-wait", "0.25"], 0.25)])
def test_gather_wait_reaches_the_engine(argv, expected, tiny_hf_dir, monkeypatch, capsys):
    seen = []

    def build(factory, idle_wait=0.05, gather_wait=0.02):
        seen.append(gather_wait)
        raise ValueError("stopped before loading")   # server.main reports it and exits 2

    monkeypatch.setattr(AsyncEngine, "build", staticmethod(build))
    assert server.main(["--model", str(tiny_hf_dir[0]), "--dtype", "float32", *argv]) == 2
    assert seen == [expected]
    assert "stopped before loading" in capsys.readouterr().err
