"""LLMEngine: owns the model, the KV pools, the scheduler and the runner; `step()` runs one
iteration of continuous batching. Synchronous; the server drives it from its own thread."""
from __future__ import annotations

import itertools
import logging
import time

import torch

from ..config import ConfigError, EngineConfig
from ..gpu.backends import make_backend
from ..kvcache.pool.allocator import OutOfPages
from ..kvcache.pool.dual_pool import DualPool
from ..kvcache.pool.layout import KVLayout, plan_pages
from ..kvcache.radix.namespace import CacheScope
from ..models import registry
from ..models.layers import INT8_MAX_ROWS, QUANT_MAX_ROWS
from .errors import EngineBroken, RequestError, StepFailed
from .face import fit
from .graph_decode import BucketedDecode, resolve_decode_graphs
from .kv_export import KVExporter
from .kv_transfer import KVTransfers
from .parts import EngineParts
from .runner import ModelRunner
from .sampling_params import SamplingParams
from .scheduler import ScheduledChunk, Scheduler
from .sequence import Sequence, Status
from .tier_loader import TierLoader
from .weights import prepare_weights

log = logging.getLogger("mimo.engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: registry.LoadedModel | None = None,
                 progress: bool = True, parts: EngineParts | None = None):
        """`loaded`: an already loaded model (default: load `config.model`). `parts`: the
        prefix cache, prefill planner and decode step (`EngineParts`; each one left None
        is built from `config`)."""
        self.config = config
        rt = config.runtime
        if rt.num_threads:
            torch.set_num_threads(rt.num_threads)
        t0 = time.perf_counter()
        backend = make_backend(rt.attention_backend, rt.device)   # refused before loading
        dtype = DTYPES[rt.dtype]
        loaded = loaded or registry.load(config.model, progress, dtype)
        self.model_config = mc = loaded.config
        self.tokenizer = loaded.tokenizer
        self.model = registry.build_model(mc, loaded.weights, dtype).to(rt.device).eval()
        self.weights = prepare_weights(self.model, rt, loaded)
        fmt = self.weights.format
        if rt.use_compile:
            # Steps the small-batch kernels serve (decode) stay eager; see compile_layers.
            above = {"int8": INT8_MAX_ROWS, "gguf": QUANT_MAX_ROWS, "q8_0": QUANT_MAX_ROWS}
            self.model.compile_layers(above=above.get(fmt, 0))
        self.max_model_len = min(config.max_model_len or mc.max_position, mc.max_position)
        if self.max_model_len < 2:
            raise ConfigError("max_model_len must be >= 2")
        cc = config.cache
        layout = KVLayout.from_model(mc, rt.dtype, cc.layout)
        context = cc.planning_context or min(self.max_model_len, 8192)
        full_pages, swa_pages = plan_pages(layout, cc, context,
                                           chunk=config.scheduler.mixed_step_tokens)
        self.pool = DualPool(layout, full_pages, swa_pages, cc.page_size, dtype, rt.device)
        parts = parts or EngineParts()
        self.cache = parts.build_prefix_cache(cc, self.pool)
        self.loader: TierLoader | None = None
        if config.tiers.enabled:
            self._add_tiers(config, loaded)
        self.runner = ModelRunner(self.model, self.pool, mc.kv_layer_types, mc.sliding_window,
                                  rt.device, backend)
        graphs, capture = resolve_decode_graphs(rt.decode_graphs, rt.device, backend.paged,
                                                self.model)
        if graphs:
            self.runner.bucketed = BucketedDecode(self.runner, config.scheduler.max_num_seqs,
                                                  self.max_model_len, capture,
                                                  strict=rt.decode_graphs == "on")
        self.decode = parts.build_decode(config, mc, self.model, self.runner)
        self.spec = self.decode if self.decode.num_draft else None  # a drafting step (stats)
        self.scheduler = Scheduler(config.scheduler, self.pool, self.cache,
                                   num_draft=self.decode.num_draft, swa_lag=self.decode.swa_lag,
                                   prefill=parts.build_prefill())
        self.transfers = KVTransfers(self.scheduler, self.pool, self.cache)
        self.exports = KVExporter(self.pool, self.runner.slots)
        self.failed_steps = 0       # steps that raised (each failed only its requests)
        self._ids = itertools.count()
        self._default_gen = torch.Generator().manual_seed(config.seed)
        self.eos_ids = frozenset(mc.eos_token_ids) | frozenset(
            getattr(self.tokenizer, "eos_token_ids", ()) or ())
        if rt.use_compile:
            self._warm_up()
        self.load_seconds = time.perf_counter() - t0

    def _warm_up(self) -> None:
        """One forward of a dummy prompt on scratch pages, freed after and never cached:
        compiling happens here, at start-up, not inside the first request's TTFT."""
        n = min(64, self.config.scheduler.max_num_batched_tokens, self.max_model_len)
        seq = Sequence(-1, [self.model_config.bos_token_id or 0] * n, SamplingParams(),
                       frozenset())
        seq.kv = self.pool.new_seq()
        try:
            self.pool.grow(seq.kv, n)
            self.runner.execute([ScheduledChunk(seq, 0, n, sample=True)])
        finally:
            self.pool.free_seq(seq.kv)
            seq.kv = None

    def _add_tiers(self, config: EngineConfig, loaded) -> None:
        """Put host memory and storage tiers under the L1 radix cache (kvcache/tiers/)."""
        from ..kvcache.radix.cache import RadixPrefixCache
        from ..kvcache.tiers.build import build_tiers, weights_identity
        from ..kvcache.tiers.keys import model_fingerprint
        if not isinstance(self.cache, RadixPrefixCache):
            raise ConfigError("KV tiers (host_kv_cache_memory, kv_storage) need the radix "
                              "prefix cache (prefix_cache=True)")
        mc = self.model_config
        fp = model_fingerprint(mc.arch, weights_identity(loaded.weights.items()),
                               self.pool.layout, self.pool.page_size, config.runtime.dtype)
        self.cache = build_tiers(config.tiers, self.cache, fp)
        if self.cache.storage is not None:
            self.loader = TierLoader(self.cache)

    def close(self) -> None:
        """Finish queued storage writes and stop the storage thread (idempotent)."""
        close = getattr(self.cache, "close", None)
        if close is not None:
            close()

    def flush_tiers(self, timeout: float = 30.0) -> bool:
        """Wait until every queued storage write was attempted."""
        storage = getattr(self.cache, "storage", None)
        return storage.flush(timeout) if storage is not None else True

    # ---- requests -------------------------------------------------------------------
    def new_sequence(self, prompt_ids: list[int], params: SamplingParams, mm=None,
                     scope: CacheScope = CacheScope()) -> Sequence:
        """Validate a request and build its Sequence without queueing it. Touches no shared
        state (ids come from a thread-safe counter), so any thread may call it. `mm`: an
        MMPrompt for a multimodal prompt (multimodal models only). `scope`: its cache salt
        and session key."""
        if not isinstance(params, SamplingParams):
            raise TypeError("params must be a SamplingParams")
        if not isinstance(scope, CacheScope):
            raise TypeError("scope must be a CacheScope")
        if not prompt_ids:
            raise RequestError("prompt is empty")
        vocab = self.model_config.vocab_size
        # set(map(type, ...)) and min/max run in C: a 3,000-token prompt checks in ~0.1 ms
        # (a Python loop over it took ~1 ms of a cached prompt's ~35 ms).
        if (not set(map(type, prompt_ids)) <= {int} or min(prompt_ids) < 0
                or max(prompt_ids) >= vocab):
            raise RequestError(f"prompt token ids must be integers in [0, {vocab})")
        # The context rule (face.fit: the one place it lives); the KV rule is below.
        fit(len(prompt_ids), params.max_tokens, self.max_model_len, 0)
        gen = (torch.Generator().manual_seed(params.seed) if params.seed is not None
               else self._default_gen)
        if mm is not None and self.model_config.vision is None:
            raise RequestError("this model takes no images or videos")
        seq = Sequence(next(self._ids), list(prompt_ids), params, self.eos_ids, generator=gen,
                       mm=mm, scope=scope)
        if not self.scheduler.fits_empty_pool(seq):
            f, s = self.scheduler.need(seq)
            raise RequestError(
                f"request needs {f} full + {s} SWA KV pages but the KV budget holds "
                f"{self.pool.full.allocator.capacity} + {self.pool.swa.allocator.capacity}; "
                f"lower max_tokens or raise --kv-cache-memory")
        return seq

    def add_request(self, prompt_ids: list[int], params: SamplingParams, mm=None,
                    scope: CacheScope = CacheScope()) -> Sequence:
        seq = self.new_sequence(prompt_ids, params, mm, scope)
        self.enqueue(seq)
        return seq

    def enqueue(self, seq: Sequence) -> None:
        """Queue a Sequence made by `new_sequence` (engine thread only). With a storage tier
        it may first wait outside the queue while its prefix is fetched (`TierLoader`)."""
        if self.loader is None or not self.loader.start(seq):
            self.scheduler.add(seq)

    def add_imported(self, seq: Sequence, payload) -> None:
        """Queue a Sequence made by `new_sequence` whose prompt KV (`payload`, a KVPayload)
        was computed by another worker; engine thread only (see kv_transfer.py)."""
        self.transfers.add(seq, payload)

    def abort(self, seq: Sequence) -> None:
        if self.loader is not None:
            self.loader.abort(seq)
        self.transfers.abort(seq)
        if seq.status is not Status.FINISHED:
            seq.finish_reason = "abort"
            self.scheduler.finish(seq)
            self.decode.finished(seq)

    def hold_paused(self, seq: Sequence) -> int:
        """`seq` finished with a tool call: its session is paused until the tool's result
        comes back as the next turn, so the cache keeps what it left (its path and the
        window before its end) after everything else for `cache.tool_pause_hold` seconds.
        Engine thread only. Returns the tokens held (0: nothing cached, or off)."""
        secs = self.config.cache.tool_pause_hold
        cache = self.scheduler._cache_of(seq)
        if (secs <= 0 or cache is None or seq.status is not Status.FINISHED
                or seq.finish_reason == "error"):
            return 0
        return cache.hold(seq.all_ids[:seq.num_computed], seq.cache_namespace, secs,
                          protect=seq.scope.session is not None)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self.loader) or bool(self.transfers)

    # ---- one iteration ------------------------------------------------------------------
    def step(self) -> list[tuple[Sequence, int]]:
        """One iteration: schedule (prefix match at admission, prefill chunks, decode
        tokens), run the model once through the decode step, append tokens, commit.
        Returns (sequence, new token) pairs in order; a decode step that verifies drafts
        may give a sequence several tokens in one step.

        A step that raises fails the requests it touched (finish reason 'error', their KV
        freed, none of it offered to the cache) and re-raises as `StepFailed`, so the next
        step goes on without them. If the pools or the tree are inconsistent afterwards,
        it raises `EngineBroken`: nothing more can be trusted."""
        try:
            return self._step()
        except Exception as e:  # noqa: BLE001 - contained below, or escalated
            failed = self._fail_step(e)
            raise StepFailed(e, failed) from e

    def _step(self) -> list[tuple[Sequence, int]]:
        dec, sched = self.decode, self.scheduler
        if self.loader:
            if not sched.has_work():
                self.loader.wait(0.01)      # only storage lookups pending: do not spin
            for seq in self.loader.ready():
                sched.add(seq)
        if self.transfers:
            self.transfers.admit()
        sched.touched = list(sched.running)     # the drafter reads every running request
        chunks = sched.schedule(dec.propose(sched.running))
        if not chunks:
            return []
        sampled = [c for c in chunks if c.sample]
        self.runner.layer_hook = self.exports.layer_hook(chunks)
        try:
            tokens = dec.execute(self.runner, self.model.lm_head, chunks)
        finally:
            self.runner.layer_hook = None
        out = []
        kept: dict[ScheduledChunk, int] = {}
        for c, toks in zip(sampled, tokens):
            emitted = []
            for t in toks:              # never past a stop: the rest of an accepted draft is dropped
                c.seq.append(t)
                emitted.append(t)
                out.append((c.seq, t))
                if c.seq.finish_reason is not None:
                    break
            k = dec.settle(c, emitted)
            if k is not None:
                kept[c] = k
        dec.end_step()
        self.exports.finish(chunks)         # before window release and before finishing
        sched.commit(chunks, kept)
        for c in chunks:
            if c.seq.finish_reason is not None:
                dec.finished(c.seq)
        return out

    def _fail_step(self, err: Exception) -> list[Sequence]:
        sched = self.scheduler
        failed = [s for s in dict.fromkeys(sched.touched) if s.status is not Status.FINISHED]
        sched.touched = []
        self.failed_steps += 1
        if isinstance(err, OutOfPages) and self.config.scheduler.admission == "reserve":
            # Reservation promises this never happens: a bug, logged with the pools' state.
            log.error("BUG: OutOfPages under admission='reserve': %s; pools %s; running %d, "
                      "waiting %d", err, self.pool.stats(), len(sched.running), len(sched.waiting))
        else:
            log.error("engine step failed (%d requests fail with it): %r", len(failed), err)
        try:
            for seq in failed:
                seq.finish_reason = "error"
                sched.fail(seq)
                self.decode.finished(seq)
            self.pool.check_integrity()
            if self.cache is not None:
                self.cache.check_integrity()
        except Exception as broken:  # noqa: BLE001
            raise EngineBroken(f"engine state is inconsistent after a failed step "
                               f"({err!r}): {broken!r}") from broken
        return failed

    def prompt_logits(self, prompt_ids: list[int], chunk: int | None = None,
                      mm=None) -> torch.Tensor:
        """Logits at every prompt position [n, vocab], computed through the paged cache in
        chunks of `chunk` tokens (default: one chunk). For scoring and reference checks; it
        bypasses the scheduler, so call it on an idle engine. `mm`: an MMPrompt (vision
        embeddings and 3-D positions) for multimodal models."""
        if self.scheduler.has_work():
            raise RuntimeError("prompt_logits needs an idle engine")
        if not prompt_ids or len(prompt_ids) > self.max_model_len:
            raise RequestError("prompt must have 1..max_model_len tokens")
        seq = Sequence(-1, list(prompt_ids), SamplingParams(max_tokens=1), self.eos_ids, mm=mm)
        seq.kv = self.pool.new_seq()
        chunk = chunk or len(prompt_ids)
        out = []
        try:
            for start in range(0, len(prompt_ids), chunk):
                n = min(chunk, len(prompt_ids) - start)
                if self.cache is not None:
                    self.cache.make_room(*self.pool.pages_to_grow(seq.kv, start + n))
                self.pool.grow(seq.kv, start + n)
                h = self.runner.execute([ScheduledChunk(seq, start, n, True)], all_logits=True)
                out.append(self.model.lm_head.logits(h))
                self.pool.release_window(seq.kv, start + n)
        finally:
            self.pool.free_seq(seq.kv)
        return torch.cat(out)

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        if self.cache is not None:
            self.cache.check_integrity()
        if not self.scheduler.has_work():
            assert self.pool.num_live_seqs == 0, "idle engine still holds sequences"
            for a in (self.pool.full.allocator, self.pool.swa.allocator):
                assert a.num_in_use == 0, f"{a.name}: {a.num_in_use} pages leaked"
