"""Speculative decoding as users switch it on: config validation, LLM kwargs, CLI flags, the
`spec` benchmark, and its Prometheus metrics."""
import json

import pytest
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf
from test_cli import _run

from mimo import LLM, SamplingParams
from mimo.api.metrics import Metrics
from mimo.config import ConfigError, SpecConfig
from mimo.engine.snapshot import engine_stats


@pytest.mark.parametrize("kw, message", [
    (dict(speculative="eagle"), "speculative must be ngram or mtp"),
    (dict(speculative="ngram", num_draft_tokens=0), "num_draft_tokens"),
    (dict(speculative="ngram", ngram_min=3, ngram_max=2), "ngram_min"),
])
def test_bad_spec_config_is_refused(kw, message):
    with pytest.raises(ConfigError, match=message):
        SpecConfig(**kw)


def test_llm_kwargs_and_mtp_refused_for_a_model_without_mtp_layers():
    loaded = loaded_from_hf(tiny_gemma3_hf())
    llm = LLM("tiny", progress=False, loaded=loaded, dtype="float32", kv_cache_memory="4MiB",
              speculative="ngram", num_draft_tokens=3)
    assert llm.engine.config.spec == SpecConfig("ngram", 3)
    assert llm.engine.scheduler.num_draft == 3
    with pytest.raises(ConfigError, match="needs a model with MTP"):
        LLM("tiny", progress=False, loaded=loaded, dtype="float32", kv_cache_memory="4MiB",
            speculative="mtp")
    off = LLM("tiny", progress=False, loaded=loaded, dtype="float32", kv_cache_memory="4MiB")
    assert off.engine.spec is None
    out = off.generate({"prompt_token_ids": [2, 5, 6, 5, 6]}, SamplingParams(max_tokens=3))
    assert out[0].spec_stats is None


def test_metrics_count_verify_steps_and_acceptance_per_position():
    loaded = loaded_from_hf(tiny_gemma3_hf())
    llm = LLM("tiny", progress=False, loaded=loaded, dtype="float32", kv_cache_memory="4MiB",
              page_size=8, speculative="ngram", num_draft_tokens=3)
    m = Metrics()
    outs = llm.generate([{"prompt_token_ids": [2] + [7, 8, 9] * 5}] * 2,
                        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    m.observe_engine(engine_stats(llm.engine, 0))
    m.observe_engine(engine_stats(llm.engine, 0))       # observing again adds nothing
    text = m.render().decode()
    t = llm.engine.spec.totals
    assert t.steps == sum(o.spec_stats["steps"] for o in outs) > 0
    assert f"mimo_spec_verify_steps_total {float(t.steps)}" in text
    assert f"mimo_spec_emitted_tokens_total {float(t.emitted)}" in text
    assert t.emitted == sum(len(o.token_ids) - 1 for o in outs)   # the first came from prefill
    for i in range(3):
        assert f'mimo_spec_draft_tokens_total{{position="{i}"}} {float(t.drafted[i])}' in text
        assert f'mimo_spec_accepted_tokens_total{{position="{i}"}} {float(t.accepted[i])}' in text
    assert "mimo_spec_mean_acceptance_length" in text
    s = outs[0].spec_stats
    assert s["mean_acceptance_length"] == round(s["emitted_tokens"] / s["steps"], 4)
    assert len(s["position_rate"]) == 3 and all(0 <= r <= 1 for r in s["position_rate"])


def test_cli_flags(tiny_hf_dir):
    d, _ = tiny_hf_dir
    base = ["-m", "mimo", "generate", "hello world hello world", "--model", str(d),
            "--max-tokens", "6", "--dtype", "float32", "--kv-cache-memory", "8MiB"]
    r = _run(*base, "--speculative", "ngram", "--num-draft-tokens", "3")
    assert r.returncode == 0, r.stderr
    assert "6 tokens in" in r.stderr
    r = _run(*base, "--speculative", "mtp")
    assert r.returncode == 2
    assert "needs a model with MTP" in r.stderr and "Traceback" not in r.stderr
    r = _run("-m", "mimo", "generate", "--help")
    assert "--speculative" in r.stdout and "--num-draft-tokens" in r.stdout


def test_spec_bench_runs_and_ends_with_one_json_line(tiny_hf_dir):
    d, _ = tiny_hf_dir
    r = _run("-m", "mimo.bench", "spec", "--model", str(d), "--drafter", "ngram",
             "--workload", "copy", "--max-tokens", "8", "--prompts", "2", "--reps", "1",
             "--dtype", "float32", "--kv-cache-memory", "16MiB")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["lossless"] is True
    assert out["decode_tps_off"] > 0 and out["decode_tps_on"] > 0 and out["speedup"] > 0
    assert out["mean_acceptance_length"] >= 1.0
    assert "[spec]" in r.stderr
    r = _run("-m", "mimo.bench", "spec", "--shape", "mimo-v2-flash-tiny", "--drafter", "mtp",
             "--max-tokens", "8", "--prompts", "1", "--reps", "1", "--dtype", "float32",
             "--kv-cache-memory", "16MiB")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["lossless"] is True and out["model"] == "mimo-v2-flash-tiny"
    assert out["num_draft_tokens_used"] == 2      # clamped to the tiny model's 2 MTP layers
    assert out["step_ms_off"] > 0 and out["step_ms_on"] > 0
    assert out["mean_acceptance_length"] >= 1.0


def test_async_engine_streams_every_token_of_a_multi_token_step():
    """A verify step can give a request several tokens, its last one ending it: the stream
    must carry all of them, with the finish reason on the final event only."""
    import asyncio

    from mimo.engine.async_engine import AsyncEngine
    loaded = loaded_from_hf(tiny_gemma3_hf())
    prompt = [2] + [11, 12, 13] * 6
    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    want = LLM("tiny", progress=False, loaded=loaded, dtype="float32",
               kv_cache_memory="4MiB").generate({"prompt_token_ids": prompt}, params)[0]
    llm = LLM("tiny", progress=False, loaded=loaded, dtype="float32", kv_cache_memory="4MiB",
              speculative="ngram")

    async def main():
        ae = AsyncEngine(llm.engine)
        ae.start()
        try:
            events = [ev async for ev in ae.submit(prompt, params)]
        finally:
            await ae.stop()
        return events

    events = asyncio.run(main())
    assert [t for ev in events for t in ev.token_ids] == want.token_ids
    assert [ev.finish_reason for ev in events][-1] == "length"
    assert all(ev.finish_reason is None for ev in events[:-1])
    assert len(events) < len(want.token_ids)        # some events carried several tokens
    llm.engine.check_integrity()
