"""encoder bench: the JSON contract on a tiny tower (the real measurement is the bench's job)."""
import json

from mimo.bench.__main__ import main


def test_encoder_bench_reports_both_modes(capsys):
    rc = main(["encoder", "--batching", "off,on", "--requests", "6", "--concurrency", "3",
               "--sizes", "56x56,56x84", "--hidden", "32", "--heads", "2", "--intermediate",
               "48", "--depth", "2", "--out-hidden", "16", "--threads", "1"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    res = json.loads(out[-1])
    for mode in ("off", "on"):
        assert res[mode]["qps"] > 0 and res[mode]["p90_ms"] > 0
    assert res["qps_ratio"] > 0 and res["requests"] == 6


def test_encoder_bench_rejects_bad_sizes(capsys):
    assert main(["encoder", "--sizes", "50x50"]) == 2
