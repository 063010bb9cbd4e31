"""peers bench: prompt lengths against the real Gemma 3 tokenizer, the cost model against
torch's FLOP counter on transformers' models and the checkpoints' own tensors, the row
comparison, the leak check on a real process tree, and one small real run of mimo alone (a
tiny Gemma 3 served by server.py) inside the loopback-only namespace when this machine has
it."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf, tiny_mimo_v2_flash_hf

from mimo.bench.model_cost import Limits, ModelCost
from mimo.bench.peer_load import QUICK, Workload, check_loopback, prompt_of, shared_pair
from mimo.bench.peer_report import ROWS, compare, median_of_rounds, summary, table
from mimo.bench.peer_servers import RunningServer, ServerSpec, peer_spec
from mimo.bench.peers import combine_rounds

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gemma_tokenizer():
    from mimo.models.gguf_loader import open_gguf
    from mimo.models.registry import resolve
    from mimo.models.tokenizer import Tokenizer
    f = open_gguf(resolve("gemma-3-270m"))
    try:
        return Tokenizer.from_gguf(f.metadata)
    finally:
        f.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prompts_have_exact_gemma_lengths(gemma_tokenizer, seed):
    rng = random.Random(seed)
    for w in (Workload(), QUICK):
        for n in (3, 16, w.prompt_tokens, w.long_tokens):
            ids = gemma_tokenizer.encode(prompt_of(rng, n))
            assert len(ids) == n and ids[0] == gemma_tokenizer.bos_token_id
        a, b = (gemma_tokenizer.encode(p) for p in shared_pair(rng, w.long_tokens, w.shared_prefix))
        assert len(a) == len(b) == w.long_tokens
        first_diff = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        assert first_diff >= w.shared_prefix
        assert first_diff < w.shared_prefix + 5        # differ right after (a repeat is 1/600)


def test_only_loopback_urls():
    for ok in ("http://127.0.0.1:8000/v1", "http://localhost:1/v1", "http://[::1]:8/v1",
               "http://127.5.0.1/v1"):
        check_loopback(ok)
    for bad in ("http://10.0.0.1:8000/v1", "http://example.com/v1", "http://0.0.0.0:80/v1"):
        with pytest.raises(ValueError):
            check_loopback(bad)


def _counted_flops(model, n: int) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    ids = torch.randint(3, 200, (1, n), generator=torch.Generator().manual_seed(n))
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(ids, logits_to_keep=1)
    return fc.get_total_flops()


@pytest.mark.parametrize("make", [tiny_gemma3_hf, tiny_mimo_v2_flash_hf])
def test_flops_match_torch_flop_counter_on_transformers(make):
    """One token: every matmul counted, exactly. Five tokens: transformers' eager attention
    multiplies the whole masked n x n matrices, the cost model only the causal keys (both
    windows exceed 5); nothing else differs. MoE experts: the eager implementation, since
    the counter does not see torch._grouped_mm."""
    model = make()
    if hasattr(model, "set_experts_implementation") and "mimo" in make.__name__:
        model.set_experts_implementation("eager")
    cost = ModelCost(loaded_from_hf(model).config)
    assert _counted_flops(model, 1) == cost.decode_flops(0) == cost.prefill_flops(0, 1)
    cfg, n = cost.cfg, 5
    per_key = sum(2 * cfg.num_heads * (cfg.kv_shape(t)[1] + cfg.kv_shape(t)[2])
                  for t in cfg.layer_types)
    causal = n * (n + 1) // 2
    assert _counted_flops(model, n) - per_key * n * n == cost.prefill_flops(0, n) - per_key * causal


@pytest.mark.parametrize("make", [tiny_gemma3_hf, tiny_mimo_v2_flash_hf])
def test_touched_params_match_the_weights(make):
    """One token reads the dense weights, the LM head and top-k experts; a long prompt reads
    every matmul weight (norms, sinks and router biases left out)."""
    loaded = loaded_from_hf(make())
    cfg, w = loaded.config, loaded.weights
    cost = ModelCost(cfg)
    skip = ("norm", "sinks", "e_score_correction_bias")
    mats = {k: v.numel() for k, v in w.items() if not any(s in k for s in skip)}
    head = mats.pop("lm_head.weight", None) or mats["model.embed_tokens.weight"]
    mats.pop("model.embed_tokens.weight")
    experts = sum(v for k, v in mats.items() if ".experts." in k)
    dense = sum(mats.values()) - experts
    assert cost.lm_head_params() == head
    assert cost.touched_params(10**9) == pytest.approx(dense + experts + head, rel=1e-9)
    sparse = sum(t == "sparse" for t in cfg.mlp_types)
    one = dense + head + sparse * cfg.num_experts_per_tok * cost.expert_params()
    assert cost.touched_params(1) == pytest.approx(one, rel=1e-9)
    assert cost.active_params() + cost.lm_head_params() == pytest.approx(one, rel=1e-9)


def test_roofline_picks_the_binding_limit():
    cost = ModelCost(loaded_from_hf(tiny_gemma3_hf()).config)
    slow_memory, slow_compute = Limits(1e3, 1e15), Limits(1e15, 1e3)
    t = cost.decode_step_time([10], slow_memory)
    assert t["bound_s"] == t["memory_s"] > t["compute_s"]
    t = cost.prefill_time(0, 64, slow_compute)
    assert t["bound_s"] == t["compute_s"] > t["memory_s"]
    # a cached prefix leaves less to compute
    assert cost.prefill_flops(48, 64) < cost.prefill_flops(0, 64)


def test_compare_rates_and_times():
    r = compare({"mimo": 90.0, "vllm": 50.0, "llama-server": 100.0}, higher=True)
    assert r["best_peer"] == "llama-server" and r["mimo_over_best"] == 0.9
    assert r["mimo_matches_or_beats"] is False
    r = compare({"mimo": 0.5, "vllm": 1.0, "llama-server": None}, higher=False)
    assert r["best_peer"] == "vllm" and r["mimo_speedup_vs_best"] == 2.0
    assert r["mimo_matches_or_beats"] is True
    assert compare({"mimo": 1.0}, higher=True)["best_peer"] is None
    rows = {r.key: compare({"mimo": 1.0, "vllm": 1.0}, r.higher_is_better) for r in ROWS}
    s = summary(rows)
    assert s["rows_compared"] == len(ROWS) and s["mimo_matches_or_beats_every_row"] is True
    assert s["rows_mimo_ahead"] == 0


def _load(decode, ttft, cold):
    """A workload result with the figures the rows read (the rest absent)."""
    return {"a_single": {"decode_tok_s": decode, "ttft_s": ttft, "prompt_tokens": 256},
            "b_concurrent": {"aggregate_tok_s": 100.0, "ttft_s_median": 1.0},
            "c_repeat": {"ttft_first_s": cold, "ttft_second_s": 0.05, "prompt_tokens": [3000, 3000],
                         "cached_tokens_second": 2990},
            "d_shared_prefix": {"ttft_second_s": 0.5, "prompt_tokens": [3000, 3000],
                                "cached_tokens_second": 2000}}


def test_rounds_report_each_rows_median_and_keep_every_round():
    cost = ModelCost(loaded_from_hf(tiny_gemma3_hf()).config)
    lim = Limits(1e10, 1e11)
    # mimo's second round fell in a slow spell, the peer's first: the medians compare.
    loads = {"mimo": [_load(60.0, 0.10, 1.0), _load(30.0, 0.30, 2.0), _load(62.0, 0.11, 1.1)],
             "llama-server": [_load(20.0, 0.40, 9.0), _load(45.0, 0.12, 6.0), _load(44.0, 0.13, 6.1)]}
    rows = table(loads, Workload(), cost, lim)
    single, ttft, cold = rows["single_decode_tok_s"], rows["single_ttft_s"], rows["cold_ttft_s"]
    assert single["values"] == {"mimo": 60.0, "llama-server": 44.0}
    assert ttft["values"] == {"mimo": 0.11, "llama-server": 0.13}
    assert cold["values"] == {"mimo": 1.1, "llama-server": 6.1}
    assert single["values_by_round"]["mimo"] == [60.0, 30.0, 62.0]
    assert ttft["mimo_matches_or_beats"] is True and single["mimo_over_best"] == round(60 / 44, 4)
    assert rows["repeat_ttft_s"]["cached_tokens"] == {"mimo": 2990, "llama-server": 2990}
    # an even count: the mean of the middle two; a round without the figure: none
    assert median_of_rounds([1.0, 3.0]) == 2.0 and median_of_rounds([1.0, None]) is None
    one = table({"mimo": [_load(60.0, 0.10, 1.0)]}, Workload(), cost, lim)
    assert "values_by_round" not in one["single_ttft_s"]
    assert one["single_ttft_s"]["values"] == {"mimo": 0.10}


def test_memory_fractions_against_the_read_rate_next_to_each_turn():
    """A round's decode rate over the memory limit the rate read next to that round implies
    (its bytes per token / the rate), the median over rounds; the run-wide fraction stays."""
    cost = ModelCost(loaded_from_hf(tiny_gemma3_hf()).config)
    lim = Limits(4e10, 1e11)
    w = Workload()
    loads = {"mimo": [_load(60.0, 0.10, 1.0), _load(30.0, 0.30, 2.0), _load(62.0, 0.11, 1.1)],
             "llama-server": [_load(20.0, 0.40, 9.0), _load(45.0, 0.12, 6.0), _load(44.0, 0.13, 6.1)]}
    read = {"mimo": [2e10, 4e10, 1e10], "llama-server": [4e10, 4e10, 4e10]}
    rows = table(loads, w, cost, lim, read)
    mid = 256 + w.max_tokens // 2
    # seconds per token at 1 byte/s: the bytes one token reads
    per_byte = cost.decode_step_time([mid], Limits(1.0, 1e11))["memory_s"]
    want = [float(f"{v * per_byte / bw:.3g}") for v, bw in zip([60.0, 30.0, 62.0], read["mimo"])]
    single = rows["single_decode_tok_s"]
    assert single["memory_fraction_by_round"]["mimo"] == want
    assert single["memory_fraction_by_turn"]["mimo"] == sorted(want)[1]
    # the same rate in every turn as in the run: the same fraction as the run-wide one
    assert single["memory_fraction_by_turn"]["llama-server"] == pytest.approx(
        single["fraction_of_limit"]["llama-server"]["memory"], rel=2e-3)
    assert single["fraction_of_limit"]["mimo"]["memory"] == pytest.approx(60.0 * per_byte / 4e10, rel=2e-3)
    # a time row: bound time over the time, against each turn's rate
    ttft = rows["single_ttft_s"]["memory_fraction_by_round"]["mimo"]
    pre = [cost.prefill_time(0, 256, Limits(bw, 1e11))["memory_s"] for bw in read["mimo"]]
    assert ttft == [float(f"{p / t:.3g}") for p, t in zip(pre, [0.10, 0.30, 0.11])]
    assert "memory_fraction_by_turn" not in table(loads, w, cost, lim)["single_decode_tok_s"]
    with pytest.raises(ValueError):       # one rate per round
        table(loads, w, cost, lim, {"mimo": [2e10], "llama-server": [4e10] * 3})


def test_a_servers_rounds_combine_into_one_record():
    def turn(status, startup, leaked, errors=()):
        return {"status": status, "startup_s": startup, "errors": list(errors),
                "stop": {"stop_s": 0.1, "leaked_pids": leaked}, "port_free_after_stop": True}
    ok = combine_rounds([turn("ok", 4.0, []), turn("ok", 5.0, []), turn("ok", 9.0, [])])
    assert ok["status"] == "ok" and ok["startup_s"] == 5.0 and len(ok["rounds"]) == 3
    bad = combine_rounds([turn("ok", 4.0, [7]), turn("failed", None, [3], ["HTTP 500"])])
    assert bad["status"] == "failed" and bad["errors"] == ["HTTP 500"]
    assert bad["stop"]["leaked_pids"] == [3, 7] and bad["startup_s"] is None
    single = turn("ok", 4.0, [])
    assert combine_rounds([single]) is single


def test_missing_peer_names_the_paths(tmp_path):
    spec = peer_spec("llama-server", tmp_path, 8090)
    assert str(tmp_path / "llama.cpp-build" / "bin" / "llama-server") in spec.missing()
    (tmp_path / "start-llama-server.sh").write_text("")
    assert str(tmp_path / "start-llama-server.sh") not in spec.missing()
    with pytest.raises(ValueError):
        peer_spec("sglang", tmp_path, 8090)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stop_kills_the_group_and_finds_an_escaped_process(tmp_path):
    """A server that ignores SIGTERM, a child in its group, and a grandchild that left the
    group (setsid): the group is killed, the escapee reported as leaked and killed."""
    pidfile = tmp_path / "escaped"
    script = (f"trap '' TERM; setsid sleep 300 & echo $! > {pidfile}; sleep 300 & "
              "while :; do sleep 1; done")
    srv = RunningServer(ServerSpec("stubborn", ("bash", "-c", script)), tmp_path / "log")
    try:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        escaped = int(pidfile.read_text())
        for _ in range(100):                   # $! is known before the child has run setsid
            if os.getpgid(escaped) != srv.pgid:
                break
            time.sleep(0.05)
        assert os.getpgid(escaped) != srv.pgid
    finally:
        res = srv.stop(grace=1.0, settle=1.0)
    assert res["forced"] is True and res["leaked_pids"] == [escaped]
    assert res["exit_code"] == -signal.SIGKILL
    for _ in range(50):
        if not _alive(escaped):
            break
        time.sleep(0.05)
    assert not _alive(escaped)
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.pgid, 0)


def test_mimo_alone_quick_run(tmp_path):
    """The whole bench with a tiny Gemma 3 on mimo alone, two rounds, peers looked for where
    there are none: the JSON line's shape, and nothing left running."""
    from mimo.models import make_tiny
    model = make_tiny.write("gemma3", tmp_path / "tiny", seed=0)
    netns = "peers" if os.path.exists("/run/netns/peers") and os.geteuid() == 0 else "none"
    cmd = ["nice", "-n", "19", sys.executable, "-m", "mimo.bench", "peers", "--quick",
           "--netns", netns, "--peers", "vllm,llama-server", "--peers-dir", str(tmp_path / "no"),
           "--model", str(model), "--port", "0", "--prompt-tokens", "24", "--max-tokens", "6",
           "--concurrency", "3", "--long-tokens", "100", "--shared-prefix", "60",
           "--single-runs", "3", "--long-runs", "3", "--mimo-args", "--threads 1", "--mimo-dir", str(ROOT),
           "--seed", "3", "--rounds", "2", "--log-dir", str(tmp_path / "logs")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["ok"] is True and res["netns"] == netns and res["seed"] == 3 and res["port"] > 0
    for peer in ("vllm", "llama-server"):
        s = res["servers"][peer]
        assert s["status"] == "not installed" and s["looked_for"]
        assert all(x.startswith(str(tmp_path / "no")) for x in s["looked_for"])
    m = res["servers"]["mimo"]
    assert m["status"] == "ok" and m["errors"] == [] and m["startup_s"] > 0
    # Each round a fresh server on its own prompts (seed + round), its log kept apart; the
    # record is the last round's, the rows the rounds' medians (of two: their mean).
    assert res["rounds"] == 2 and len(m["rounds"]) == 2
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["mimo.1.log", "mimo.2.log"]
    r1, r2 = (t["load"] for t in m["rounds"])
    assert m["load"] == r2 and [t["seed"] for t in m["rounds"]] == [3, 4]
    assert m["startup_s"] == pytest.approx((m["rounds"][0]["startup_s"] + m["rounds"][1]["startup_s"]) / 2)
    cold = res["rows"]["cold_ttft_s"]
    assert cold["values_by_round"]["mimo"] == [r1["c_repeat"]["ttft_first_s"], r2["c_repeat"]["ttft_first_s"]]
    assert cold["values"]["mimo"] == pytest.approx(sum(cold["values_by_round"]["mimo"]) / 2)
    assert m["stop"]["leaked_pids"] == [] and m["port_free_after_stop"] is True
    assert res["mimo_args"] == ["--model", str(model), "--threads", "1"]
    assert res["mimo_dir"] == str(ROOT) and m["argv"][1] == str(ROOT / "server.py")
    assert res["machine"]["matmul_gflops"] > 0 and res["machine"]["bandwidth_gbs"] > 0
    # the read rate next to each turn: one measured between turns serves both neighbours
    (b1, a1), (b2, a2) = ((t["read_gbs"]["before"], t["read_gbs"]["after"]) for t in m["rounds"])
    assert min(b1, a1, b2, a2) > 0 and a1 == b2
    dec = res["rows"]["single_decode_tok_s"]
    assert len(dec["memory_fraction_by_round"]["mimo"]) == 2
    assert res["single_decode_memory_fraction"]["mimo"] == {
        "run": dec["fraction_of_limit"]["mimo"]["memory"], "turns": dec["memory_fraction_by_turn"]["mimo"]}
    assert set(res["rows"]) == {r.key for r in ROWS}
    for key, row in res["rows"].items():
        assert row["values"]["mimo"] > 0, key
        f = row["fraction_of_limit"]["mimo"]
        assert 0 < f["roofline"] == max(f["memory"], f["compute"]), key
        assert row["best_peer"] is None and row["mimo_matches_or_beats"] is None
    assert res["rows"]["repeat_ttft_s"]["cached_tokens"]["mimo"] > 0
    load = m["load"]
    a = load["a_single"]        # TTFT: the runs' median; decode: the best run's
    assert a["runs"] == 3 and a["ttft_s"] == sorted(a["ttft_s_all"])[1]
    assert a["decode_tok_s"] == max(a["decode_tok_s_all"])
    for part in ("c_repeat", "d_shared_prefix"):     # each TTFT: the runs' median
        c = load[part]
        assert c["runs"] == 3 and c["ttft_first_s"] == sorted(c["ttft_first_s_all"])[1], part
        assert c["ttft_second_s"] == sorted(c["ttft_second_s_all"])[1], part
    assert res["rows"]["repeat_ttft_s"]["values_by_round"]["mimo"][-1] == load["c_repeat"]["ttft_second_s"]
    assert load["b_concurrent"]["streams"] == 3 and load["b_concurrent"]["min_output_tokens"] == 6
    assert res["summary"]["rows_compared"] == 0
    # Independently of the bench's own check: no process serves the tiny model any more.
    left = subprocess.run(["pgrep", "-f", str(model)], capture_output=True, text=True).stdout
    assert left.strip() == ""
