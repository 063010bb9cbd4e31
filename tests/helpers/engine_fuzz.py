"""An engine-level randomized differential test: tiny Gemma 3 and MiMo-V2-Flash configs, small
pools, random SWA shares, page sizes, windows, chunk budgets (a smaller one while requests
decode), admission modes, retention and rebuild settings, n-gram and MTP drafting; requests
with shared prefixes around page and window boundaries, multi-turn continuations, repeated
prompts, stop tokens, and aborts of waiting and running requests.

After every step: the pools' and the tree's `check_integrity()`, and the page tables of the
running requests: every page in a table is IN_USE (never free, never evictable), and no page
a request owns is in two tables. At the end the engine is idle with no page in use, and every
finished request's greedy tokens equal those of a cache-off, roomy-pool reference that runs
each request alone (an aborted one's tokens are a prefix of them). A difference at a position
whose reference top-2 logit margin is below `TIE` is a floating-point near-tie, not a bug;
so is one the cache-free reference reproduces when the request is batched with a copy of
itself (batch-size rounding flipping a near-tie inside the model, e.g. MoE routing).

`python tests/helpers/engine_fuzz.py --seeds 0:3000` runs thousands locally; the suite replays
a fixed set (tests/engine/test_engine_fuzz.py).
"""
from __future__ import annotations

import dataclasses
import os
import random
import sys
import traceback
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if __name__ == "__main__":   # run as a script: import `helpers` and `mimo` from this checkout
    _tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [_tests, os.path.dirname(_tests)]

import torch  # noqa: E402

from helpers.sched_harness import check_lock_rule  # noqa: E402
from mimo import LLM, SamplingParams
from mimo.config import SchedulerConfig
from mimo.engine.engine import RequestError, StepFailed
from mimo.engine.parts import EngineParts
from mimo.engine.prefill_planner import ChunkedPrefill
from mimo.kvcache.pool.allocator import EVICTABLE, FREE, IN_USE, OutOfPages
from mimo.kvcache.pool.layout import swa_steady_pages, swa_transient_pages
from mimo.kvcache.radix.retention import POLICIES
from mimo.models.hf_config import model_config_from_hf
from mimo.models.registry import LoadedModel

TIE = 1e-3
MAX_STEPS = 4000
STALL_STEPS = 200       # steps with work but no progress at all: a wedge


# ---- models (built once per process) ----------------------------------------------------------
_MODELS: dict = {}


def model(kind: str, window: int) -> LoadedModel:
    """('gemma3' | 'mimo' | 'mimo-mtp', window) -> a tiny random LoadedModel."""
    key = (kind, window)
    if key not in _MODELS:
        from helpers.tiny_models import tiny_gemma3_hf, tiny_mimo_v2_flash_hf
        if kind == "gemma3":
            hf = tiny_gemma3_hf(seed=window, sliding_window=window)
            cfg = model_config_from_hf(hf.config.to_dict())
            w = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        else:
            from helpers.mtp_reference import mtp_weights
            hf = tiny_mimo_v2_flash_hf(seed=window, sliding_window_size=window)
            cfg = model_config_from_hf(hf.config.to_dict())
            w = {k: v.detach().clone() for k, v in hf.state_dict().items()}
            if kind == "mimo-mtp":
                w |= mtp_weights(hf, 2)
                cfg = dataclasses.replace(cfg, num_mtp_layers=2)
        _MODELS[key] = LoadedModel(cfg, w, None, "tiny")
    return _MODELS[key]


_REFS: dict = {}
_REF_ENGINES: dict = {}


def _ref_llm(key):
    if key not in _REF_ENGINES:
        _REF_ENGINES[key] = LLM("tiny", loaded=model(*key), progress=False, dtype="float32",
                                prefix_cache=False, kv_cache_memory="16MiB", page_size=4,
                                max_num_batched_tokens=256)
    return _REF_ENGINES[key]


def reference(key, prompt: list[int], params: SamplingParams) -> list[int]:
    """Greedy tokens of the request alone, cache off, a roomy pool (memoized)."""
    k = (key, tuple(prompt), params.max_tokens, tuple(params.stop_token_ids), params.ignore_eos)
    if k not in _REFS:
        eng = _ref_llm(key).engine
        seq = eng.add_request(prompt, params)
        while eng.has_work():
            eng.step()
        _REFS[k] = list(seq.output_ids)
    return _REFS[k]


def batched_reference(key, prompt: list[int], params: SamplingParams) -> list[int]:
    """Greedy tokens of the request decoded beside a copy of itself, cache off, a roomy
    pool: what batch-size-dependent rounding alone gives (a near-tie in the tiny MoE's
    expert routing flips under it, beyond what the logit margin shows)."""
    eng = _ref_llm(key).engine
    a = eng.add_request(prompt, params)
    eng.add_request(prompt, params)     # its twin, batched beside it
    while eng.has_work():
        eng.step()
    return list(a.output_ids)


def margin_at(key, tokens: list[int]) -> float:
    """Top-2 logit margin of the reference's next-token prediction after `tokens`."""
    logits = _ref_llm(key).engine.prompt_logits(tokens)[-1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


# ---- cases ------------------------------------------------------------------------------
@dataclass
class Req:
    prompt: list[int]
    params: SamplingParams
    arrive: int                         # step at which it is submitted (after `after`)
    after: int | None = None            # index of a request that must end first
    abort_at: int | None = None         # steps after submission; None: never aborted
    seq: object = None
    submitted_step: int | None = None


@dataclass
class Case:
    seed: int
    model: tuple
    opts: dict
    reqs: list[Req] = field(default_factory=list)

    def describe(self) -> str:
        reqs = [(len(r.prompt), r.params.max_tokens, r.arrive, r.after, r.abort_at)
                for r in self.reqs]
        return f"seed={self.seed} model={self.model} opts={self.opts} reqs={reqs}"


def make_case(seed: int, tight: bool = False) -> Case:
    """`tight`: the full pool holds the largest request and at most as much again, so
    requests queue for pages and optimistic admission preempts."""
    rng = random.Random(seed)
    kind = rng.choice(["gemma3", "gemma3", "mimo", "mimo-mtp"])
    window = rng.choice([4, 5, 7, 8] if kind == "gemma3" else [6, 7])
    loaded = model(kind, window)
    vocab = loaded.config.vocab_size
    P = rng.choice([1, 2, 3, 4, 8])
    spec = rng.choice([None, None, "ngram"] + (["mtp", "mtp"] if kind == "mimo-mtp" else []))
    opts = dict(page_size=P, max_num_batched_tokens=rng.choice([4, 8, 13, 32, 64]),
                max_num_seqs=rng.choice([2, 4, 8, 64]),
                admission=rng.choice(["reserve", "optimistic"]),
                retention=rng.choice(sorted(POLICIES)),
                window_rebuild=rng.random() < 0.6,
                policy=rng.choice(["fcfs", "compute-aware"]),
                prefix_cache=rng.random() < 0.9)
    if spec:
        opts |= dict(speculative=spec, num_draft_tokens=rng.choice([1, 2, 3]))
    # Pool sizes in pages (the budget is set from them): tight, so pools run full.
    opts["_full_pages"] = rng.randint(3, 30) * 8 // P + rng.randint(0, 8)
    opts["_swa_pages"] = rng.randint(2, 16) * 8 // P + rng.randint(0, 8)
    case = Case(seed, (kind, window), opts)

    W = window
    bases = []
    for _ in range(rng.randint(1, 3)):   # shared prefixes, cut near page and window edges
        n = rng.choice([P * rng.randint(1, 8), W * rng.randint(1, 4), rng.randint(1, 60)])
        n += rng.choice([-1, 0, 0, 1])
        bases.append([rng.randrange(3, vocab) for _ in range(max(1, n))])
    n_req = rng.randint(2, 9)
    for _ in range(n_req):
        r = rng.random()
        if r < 0.2 and case.reqs:           # the same prompt again
            src = rng.choice(case.reqs)
            prompt, after = list(src.prompt), None
        elif r < 0.4 and case.reqs:         # a later turn: earlier prompt + its answer + more
            j = rng.randrange(len(case.reqs))
            src = case.reqs[j]
            prompt = src.prompt + reference(case.model, src.prompt, src.params)
            prompt += [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))]
            after = j
        else:
            base = rng.choice(bases)
            cut = rng.choice([len(base), max(1, len(base) - rng.randint(0, P + 1))])
            prompt = base[:cut] + [rng.randrange(3, vocab) for _ in range(rng.randint(0, 20))]
            after = None
        prompt = prompt[:120]
        stop = []
        if rng.random() < 0.25:
            stop = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 20))]
        params = SamplingParams(temperature=0, max_tokens=rng.randint(1, 24),
                                ignore_eos=rng.random() < 0.7, stop_token_ids=stop)
        abort_at = rng.choice([None] * 6 + [0, 1, 2, 5, 9])
        case.reqs.append(Req(prompt, params, arrive=rng.choice([0, 0, 0, 1, 3, 8, 20]),
                             after=after, abort_at=abort_at))
    if rng.random() < 0.15:     # a step that raises while planning one request's chunk
        case.opts["_fault"] = (rng.randrange(6), rng.choice([1, 1, 2]))
    if tight:
        most = max(-(-(len(r.prompt) + r.params.max_tokens) // P) for r in case.reqs)
        opts["_full_pages"] = most + rng.randint(0, most)
        for r in case.reqs:
            r.arrive = min(r.arrive, rng.choice([0, 1]))
    # A host-memory tier below the pools (L1 evictions go down, hits come back up), in
    # multiples of the pools' budget. Drawn last: the earlier draws of a seed stay the same.
    if opts["prefix_cache"] and rng.random() < 0.4:
        case.opts["_host"] = rng.choice([0.5, 1.0, 3.0])
    edge = rng.randint(0, 2) if rng.random() < 0.3 else None
    # A smaller budget while requests decode: steps with nobody decoding take larger chunks
    # than the SWA pool reserves for, in whatever pages are free. Drawn last, as above.
    if rng.random() < 0.4:
        opts["max_mixed_batched_tokens"] = rng.choice([1, 2, 3, 5, 8])
    if edge is not None:
        case.opts["_swa_pages"] = edge_swa_pages(case, edge)
    return case


def edge_swa_pages(case: Case, slack: int) -> int:
    """An SWA pool at the edge: the largest request's steady window (as its drafts and a
    lagging drafter widen it) plus one prefill chunk's transient pages, plus `slack`. A
    request then runs alone, or beside few others, with nothing to spare while it decodes
    past the windows the prefix cache locked for it."""
    o, W = case.opts, case.model[1]
    spec = o.get("speculative")
    nd = o.get("num_draft_tokens", 0) if spec else 0
    if spec == "mtp":           # drafts clamped to the 2 MTP layers; release lags by 2
        nd = min(nd, 2) + 2
    P = o["page_size"]
    longest = max(len(r.prompt) + r.params.max_tokens for r in case.reqs)
    return (swa_steady_pages(W + nd, P, longest)
            + swa_transient_pages(SchedulerConfig(
                max_num_batched_tokens=o["max_num_batched_tokens"],
                max_mixed_batched_tokens=o.get("max_mixed_batched_tokens", 512)
            ).mixed_step_tokens, P) + slack)


class FaultyPrefill(ChunkedPrefill):
    """Raises once, planning the `nth` prefill chunk of request `seq_id` (a pool running out
    mid-plan, say): that request fails, the rest go on."""
    def __init__(self, seq_id: int, nth: int):
        self.seq_id, self.left, self.raised = seq_id, nth, False

    def plan(self, seq, remaining, budget, room):
        if seq.id == self.seq_id and not self.raised:
            self.left -= 1
            if self.left <= 0:
                self.raised = True
                raise OutOfPages("injected fault")
        return super().plan(seq, remaining, budget, room)


def build(case: Case) -> LLM:
    opts = {k: v for k, v in case.opts.items() if not k.startswith("_")}
    if "_fault" in case.opts:
        opts["parts"] = EngineParts(prefill=FaultyPrefill(*case.opts["_fault"]))
    loaded = model(*case.model)
    probe = _ref_llm(case.model).engine.pool.layout
    P = opts["page_size"]
    fb, sb = probe.full_bytes_per_token * P, probe.swa_bytes_per_token * P
    F, S = case.opts["_full_pages"], case.opts["_swa_pages"]
    # Whole pages either side of the split (float rounding must not lose one).
    budget = F * fb + S * sb
    share = (S * sb + 0.5) / budget
    if "_host" in case.opts:
        opts["host_kv_cache_memory"] = int(budget * case.opts["_host"])
    return LLM("tiny", loaded=loaded, progress=False, dtype="float32", kv_cache_memory=budget,
               swa_share=share, **opts)


# ---- checks ------------------------------------------------------------------------------
def check_tables(eng) -> None:
    """Every page in a running request's table is IN_USE; a page the request owns (not the
    cache's) is in no other table; waiting requests hold no pages."""
    pool = eng.pool
    fa, sa = pool.full.allocator, pool.swa.allocator
    own_f, own_s = set(), set()
    for seq in eng.scheduler.running:
        kv = seq.kv
        for p in kv.full_pages:
            assert fa._state[p] == IN_USE, f"request {seq.id}: full page {p} not in use"
            if not pool.is_shared_full(p):
                assert p not in own_f, f"full page {p} in two tables"
                own_f.add(p)
        for p in kv.swa_pages:
            if p is None:
                continue
            assert sa._state[p] == IN_USE, f"request {seq.id}: SWA page {p} not in use"
            if not pool.is_shared_swa(p):
                assert p not in own_s, f"SWA page {p} in two tables"
                own_s.add(p)
    for seq in list(eng.scheduler.waiting):
        assert seq.kv is None, f"waiting request {seq.id} holds pages"


def run_case(case: Case) -> dict:
    """Drive the engine through the case; raises AssertionError on any failure."""
    llm = build(case)
    eng = llm.engine
    step, stall, last_progress = 0, 0, None
    live: list[Req] = []
    pending = list(case.reqs)
    rejected = 0
    while True:
        for r in list(pending):
            dep = case.reqs[r.after] if r.after is not None else None
            if dep is not None and dep not in pending and dep.seq is None:
                pending.remove(r)       # its earlier turn was refused: so is it
                rejected += 1
                continue
            if step < r.arrive or (dep is not None and (dep.seq is None
                                                        or dep.seq.finish_reason is None)):
                continue
            pending.remove(r)
            try:
                r.seq = eng.add_request(r.prompt, r.params)
            except RequestError:
                rejected += 1          # bigger than the empty pool: refused up front
                r.seq = None
                continue
            r.submitted_step = step
            live.append(r)
        for r in live:
            if (r.abort_at is not None and r.seq.finish_reason is None
                    and step - r.submitted_step >= r.abort_at):
                eng.abort(r.seq)
        if not eng.has_work():
            if not pending:
                break
            step += 1
            if step > MAX_STEPS:
                raise AssertionError("pending requests never became submittable")
            continue
        try:
            eng.step()
        except StepFailed as e:
            assert "_fault" in case.opts and isinstance(e.cause, OutOfPages) \
                and "injected" in str(e.cause), f"a step failed: {e.cause!r}"
            assert all(s.finish_reason == "error" for s in e.failed) and len(e.failed) == 1
        step += 1
        eng.check_integrity()
        check_tables(eng)
        if eng.cache is not None:
            check_lock_rule(eng.scheduler, eng.cache)
        progress = (sum(len(r.seq.output_ids) for r in live),
                    sum(r.seq.num_computed for r in live), len(eng.scheduler.running))
        stall = stall + 1 if progress == last_progress else 0
        last_progress = progress
        assert stall < STALL_STEPS, f"engine wedged at step {step}"
        assert step < MAX_STEPS, "engine did not drain"
    eng.check_integrity()
    fa, sa = eng.pool.full.allocator, eng.pool.swa.allocator
    for a in (fa, sa):          # free + evictable + in_use == capacity, page by page
        counts = [int((a._state == st).sum()) for st in (FREE, EVICTABLE, IN_USE)]
        assert counts == [a.num_free, a.num_evictable, a.num_in_use], a.name
        assert sum(counts) == a.capacity, a.name
    assert fa.num_in_use == 0 and sa.num_in_use == 0, "pages in use at idle"
    ties = 0
    for r in live:
        want = reference(case.model, r.prompt, r.params)
        got = r.seq.output_ids
        if r.seq.finish_reason == "error":
            continue            # the injected fault's request
        if r.seq.finish_reason == "abort":
            cmp_to = want[:len(got)]
        else:
            assert r.seq.finish_reason in ("stop", "length"), r.seq.finish_reason
            cmp_to = want
        if got != cmp_to:
            d = next((i for i, (a, b) in enumerate(zip(got, cmp_to)) if a != b),
                     min(len(got), len(cmp_to)))
            if d < min(len(got), len(cmp_to)) and margin_at(case.model, r.prompt + want[:d]) < TIE:
                ties += 1
                continue
            alt = batched_reference(case.model, r.prompt, r.params)
            if got == (alt[:len(got)] if r.seq.finish_reason == "abort" else alt):
                ties += 1       # the cache-free engine gives the same tokens in a batch
                continue
            raise AssertionError(f"request {r.seq.id}: tokens {got} != reference {cmp_to} "
                                 f"(first difference at {d})")
    preempted = sum(r.seq.preemptions for r in live)
    faults = sum(r.seq.finish_reason == "error" for r in live)
    # Prompt tokens reused from partial pages (kvcache/radix/tails.py): the cases reach them.
    partial = eng.cache.counters().get("partial_tokens", 0) if eng.cache is not None else 0
    return dict(steps=step, rejected=rejected, ties=ties, preemptions=preempted, faults=faults,
                partial_tokens=partial)


def main(argv=None) -> int:
    import argparse
    import time
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0:200", help="a range lo:hi or a comma list")
    p.add_argument("--stop-first", action="store_true")
    p.add_argument("--tight", action="store_true", help="full pools: queueing and preemption")
    a = p.parse_args(argv)
    torch.set_num_threads(1)    # tiny matmuls: one thread is faster, and leaves a core free
    import logging
    logging.getLogger("mimo.engine").setLevel(logging.CRITICAL)  # the injected faults' logs
    if ":" in a.seeds:
        lo, hi = map(int, a.seeds.split(":"))
        seeds = range(lo, hi)
    else:
        seeds = [int(s) for s in a.seeds.split(",")]
    failed, t0, tot = [], time.time(), dict(preemptions=0, ties=0, rejected=0,
                                                faults=0, partial_tokens=0)
    import faulthandler
    for i, s in enumerate(seeds):
        faulthandler.dump_traceback_later(300, exit=True)   # a hang is a failure too
        case = make_case(s, a.tight)
        try:
            out = run_case(case)
            for k in tot:
                tot[k] += out[k]
        except Exception as e:  # noqa: BLE001 - report every failing seed
            failed.append(s)
            print(f"FAIL seed {s}: {type(e).__name__}: {e}\n  {case.describe()}", flush=True)
            traceback.print_exc(limit=6)
            if a.stop_first:
                break
        if i % 50 == 49:
            print(f"{i + 1} cases, {len(failed)} failed, {time.time() - t0:.0f} s", flush=True,
                  file=sys.stderr)
    import json
    print(json.dumps(dict(cases=len(seeds), failed=failed, **tot,
                          seconds=round(time.time() - t0, 1))))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
