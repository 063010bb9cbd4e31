"""cache-sim with the lower tiers: the JSON contract of --l2-budget / --l3-budget /
--tier-scale, its figures' internal consistency on a prefix of the real conversation trace,
and the tiered plot. The hit-for-hit check against a reference model is
tests/kvcache/test_cache_sim_tier_model.py; the full-trace figures are the bench's job."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo.bench.__main__ import main

CONVERSATION = Path(__file__).resolve().parents[2] / "data" / "traces" / "conversation_trace.jsonl"
GiB = 2**30


def run_cli(argv, capsys):
    rc = main(["cache-sim", *argv])
    out = capsys.readouterr()
    return rc, out.out.strip().splitlines(), out.err


@pytest.fixture(scope="module")
def conversation():
    if not CONVERSATION.is_file():
        pytest.fail(f"the Mooncake conversation trace is missing: expected it at {CONVERSATION}")
    return str(CONVERSATION)


def test_tiers_report(conversation, capsys, tmp_path):
    """Two points of a --tier-scale sweep, hybrid, full-kv and off: per tier hit rates that
    add up, tiers within budget, SWA's bytes read apart, ages per tier, the summary's
    ratios, progress lines, and the stacked plot."""
    png = tmp_path / "tiers.png"
    argv = ["--trace", conversation, "--limit", "300", "--jobs", "1", "--swa-share", "fill",
            "--kv-budget", "20GiB", "--l2-budget", "100GiB", "--l3-budget", "1TiB",
            "--tier-scale", "0.5,1", "--policy", "hybrid,full-kv,off"]
    try:
        import matplotlib  # noqa: F401
        argv += ["--plot", str(png)]
    except ImportError:
        png = None
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    res = json.loads(out[-1])
    assert list(res["summary"]) == ["10GiB+50GiB+512GiB", "20GiB+100GiB+1024GiB"]
    by = {(r["policy"], r["kv_budget_bytes"]): r for r in res["results"]}
    assert len(by) == 6 and "tiers" not in by[("off", 20 * GiB)]
    for (pol, l1), r in by.items():
        if pol == "off":
            assert r["hit_rate"] == 0
            continue
        t = r["tiers"]
        assert (t["l1_bytes"], t["l2_bytes"], t["l3_bytes"]) == (l1, 5 * l1, int(51.2 * l1))
        assert t["total_bytes"] == l1 + t["l2_bytes"] + t["l3_bytes"]
        assert sum(t["hit_tokens_by_tier"].values()) == r["hit_tokens"]
        for name in ("L2", "L3"):
            assert 0 < t[name]["used_bytes"] <= t[name]["budget_bytes"]
            assert t[name]["bytes_read"] == t["full_bytes_read"][name] + t["swa_bytes_read"][name]
        moved = (sum(t["full_bytes_read"].values()) + sum(t["swa_bytes_read"].values()))
        assert t["bytes_moved_per_reused_token"] == round(moved / r["hit_tokens"], 1)
        assert t["bytes_written_per_prompt_token"]["L3"] == round(
            t["L3"]["bytes_written"] / r["prompt_tokens"], 1)
        assert t["age_unit"] == "s" and t["hit_age"]["all"]["hits"] == sum(
            t["hit_age"][k]["hits"] for k in ("L1", "L2", "L3"))
        assert t["hit_age"]["all"]["max"] <= 200       # 300 requests span about 200 s
        if pol == "full-kv":
            assert not any(t["swa_bytes_read"].values())
    big = res["summary"]["20GiB+100GiB+1024GiB"]
    # The lower tiers serve much of the hybrid hits; reading them costs SWA's window only.
    assert big["hybrid_by_tier"]["L2"] + big["hybrid_by_tier"]["L3"] > big["hybrid_by_tier"]["L1"]
    assert 0 < big["hybrid_bytes_moved_over_full_kv"] < 0.25
    assert sum(by[("hybrid", 20 * GiB)]["tiers"]["swa_bytes_read"].values()) > 0
    assert "KiB moved per reused token" in err and "hybrid@20GiB+100GiB+1024GiB" in err
    if png is not None:
        assert png.stat().st_size > 1000


def test_without_tiers_the_report_is_unchanged(conversation, capsys):
    rc, out, err = run_cli(["--trace", conversation, "--limit", "50", "--jobs", "1",
                            "--swa-share", "fill", "--kv-budget", "20GiB"], capsys)
    assert rc == 0, err
    res = json.loads(out[-1])
    assert list(res["summary"]) == ["20GiB"] and all("tiers" not in r for r in res["results"])


def test_tier_flags_reject_bad_input(conversation, capsys):
    for flag, bad in (("--l2-budget", "lots"), ("--l3-budget", "-1GiB"), ("--tier-scale", "0"),
                      ("--tier-scale", "x")):
        rc, out, err = run_cli(["--trace", conversation, "--limit", "5", f"{flag}={bad}"], capsys)
        assert rc == 2 and flag in err, (flag, err)
        assert not out
