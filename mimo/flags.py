"""Command-line flags, defined once for every entry point that loads a model: `python
server.py`, `python -m mimo generate` and the benchmarks. Each engine flag maps 1:1 to a
config field (mimo/config/); `engine_opts` turns parsed flags into `LLM` / `engine_config`
keywords."""
from __future__ import annotations

import argparse

from .config import ATTENTION_BACKENDS, PREFILL_MATMULS, QUANTIZE, ConfigError, ServerConfig


def _cpu_line() -> str:
    from .cpu.features import CPUFeatureError, amx_wanted, chosen_isa, cpu_info
    info = cpu_info()
    try:
        isa = chosen_isa(info) or "none (plain PyTorch)"
        if isa == "avx512-vnni" and info.amx_int8:
            isa += (", 16-row batches on AMX-INT8 tiles" if amx_wanted()
                    else ", AMX-INT8 tiles off (MIMO_CPU_AMX)")
    except CPUFeatureError as e:
        isa = f"invalid ({e})"
    return (f"This CPU: {info.summary()}; bfloat16 arithmetic "
            f"{'native' if info.native_bf16 else 'not native (dtype auto: float32)'}; "
            f"CPU kernel build: {isa}.")


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Engine flags shared by every command that loads a model; each maps 1:1 to a config
    field (mimo/config/)."""
    g = p.add_argument_group("engine")
    p.epilog = ((p.epilog or "") + " " + _cpu_line()).strip()
    _model_flags(g)
    _cache_flags(g)
    _scheduler_flags(g)
    _tier_flags(p.add_argument_group("KV tiers (below the device pools)"))


def _model_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--model", default="gemma-3-270m",
                   help="built-in name (gemma-3-270m), a .gguf file, or a Hugging Face directory")
    g.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="activation and KV dtype (auto: bfloat16 on GPUs and on CPUs with "
                        "native bf16 (AVX-512-BF16, AMX), else float32; float32 reproduces "
                        "reference numerics)")
    g.add_argument("--quantize", default="auto", choices=list(QUANTIZE),
                   help="weights of decode-sized steps: gguf (the GGUF file's own blocks "
                        "through mimo's C++ CPU kernels), q8_0 (Q8_0 blocks made from float "
                        "weights, same kernels), int8 (torch's int8 weight-only kernel, "
                        "bfloat16 only), none; auto: gguf for a GGUF model where the kernels "
                        "load, else int8 on CPU bfloat16. $MIMO_CPU_ISA=avx2|avx512-vnni|none "
                        "forces a kernel build")
    g.add_argument("--prefill-matmul", default="auto", choices=list(PREFILL_MATMULS),
                   help="weights of prefill-sized steps (over 16 rows) with gguf/q8_0 "
                        "weights: dense (torch's GEMM on the dense copy), blocks (the blocks' "
                        "int8 C++ GEMM, 8-bit activations); auto: blocks in bfloat16 with the "
                        "AVX-512 VNNI kernels on a CPU without AMX, else dense")
    g.add_argument("--greedy-head", default="auto", choices=["auto", "exact", "int4"],
                   help="greedy argmax of the LM head: exact (of the int8 logits, proven by "
                        "an error bound) or int4 (an int4 copy scores, its best 64 are "
                        "rescored exactly; auto: int4 when int8 weights are on)")
    g.add_argument("--compile", default=None, choices=["auto", "on", "off"],
                   help="torch.compile the layers for prefill-sized steps (auto: off, "
                        "measured slower than eager on CPU; default: $MIMO_COMPILE, else auto)")
    g.add_argument("--attention-backend", default="auto",
                   choices=list(ATTENTION_BACKENDS),
                   help="attention kernels: torch (gather + SDPA, any device), triton (paged "
                        "kernels, CUDA), cpu (mimo's C++ kernels: decode rows in place, prefill "
                        "on a bf16 flash kernel with AVX512-BF16), flashinfer (refused: not "
                        "built in yet); auto: triton on a CUDA device when triton imports, cpu "
                        "on CPU when the kernels load, else torch")
    g.add_argument("--decode-graphs", default="auto", choices=["auto", "on", "off"],
                   help="run steps of plain decodes padded to fixed batch sizes (1, 2, 4, "
                        "then multiples of 8 up to --max-num-seqs) from static buffers, "
                        "captured as CUDA graphs on CUDA (on CPU: the same padded step, "
                        "eager); needs --attention-backend triton; auto: on for CUDA with "
                        "triton unless the model's decode reads back to the host (MoE)")
    g.add_argument("--repack", default="auto", choices=["auto", "off"],
                   help="gguf and q8_0 weights in the layout the CPU kernels multiply fastest (auto: "
                        "Q5_0, Q8_0, Q4_K and Q6_K weights repacked 8 rows a tile at start-up, the same "
                        "values, with the AVX2 kernels; Q5_0, Q4_K and Q6_K with the AVX-512 VNNI kernels "
                        "on a CPU without AMX); off: the GGUF's blocks as stored")
    g.add_argument("--fused-decode", default="auto", choices=["auto", "off"],
                   help="decode steps with gguf/q8_0 weights run each decoder layer as one "
                        "C++ call (auto: where the CPU kernels load and run the layer's "
                        "shape); off: the plain PyTorch layers")


def _cache_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--kv-cache-memory", default="1GiB", help="byte budget of both KV pools")
    g.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    g.add_argument("--swa-share", type=float, default=None,
                   help="fraction of the KV budget for the SWA pool (default: from model shapes)")
    g.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV of cached prompt prefixes (SWA-aware radix tree; "
                        "--no-prefix-cache turns it off)")
    g.add_argument("--retention", default="hybrid-output",
                   choices=["hybrid-output", "hybrid", "prompt-only", "keep-all"],
                   help="which SWA KV the prefix cache keeps after a request: hybrid-output "
                        "(prompt, output end, branch points, sparse grid, and a prefill's "
                        "chunk pages as spare SWA: evicted first, never copied to the tiers), "
                        "hybrid (the same "
                        "without outputs: for models whose next turn drops them), prompt-only, "
                        "keep-all")
    g.add_argument("--window-rebuild", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse a cached prefix whose SWA window was not kept by recomputing "
                        "only the SWA layers' receptive field before its end ((window - 1) "
                        "x SWA layers tokens), not everything since the last kept window")
    g.add_argument("--tool-pause-hold", type=float, default=120.0, metavar="SECONDS",
                   help="a session whose last turn ended in a tool call keeps its cached "
                        "prefix and trailing SWA window after everything else (speculative "
                        "windows, finished sessions) for this long, waiting for the tool's "
                        "result (default 120; 0: off)")


def _scheduler_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--max-num-seqs", type=int, default=64, help="most requests running at once")
    g.add_argument("--max-num-batched-tokens", type=int, default=1536,
                   help="prefill (and draft) tokens of one step, the prefill chunk size; "
                        "each decoding request's own token comes on top")
    g.add_argument("--max-mixed-batched-tokens", type=int, default=512,
                   help="the same while any request is decoding (each decoding stream waits "
                        "for the step), at most --max-num-batched-tokens; a chunk this size "
                        "always fits the SWA pool, a larger one only in free pages")
    g.add_argument("--max-model-len", type=int, default=None, help="context limit (default: model's)")
    g.add_argument("--policy", default="compute-aware", choices=["compute-aware", "fcfs"],
                   help="waiting-queue order: fewest uncached prompt tokens first (with aging), "
                        "or arrival order")
    g.add_argument("--aging-per-second", type=float, default=1000.0,
                   help="compute-aware aging: a waiting request gains this many tokens of "
                        "priority per second (bounds every wait)")
    g.add_argument("--admission", default="reserve", choices=["reserve", "optimistic"],
                   help="reserve: admit when prompt + max_tokens fit (no preemption); "
                        "optimistic: admit when the prompt fits, preempt the newest request "
                        "if decoding runs out of KV (its KV stays in the prefix cache)")
    g.add_argument("--length-buckets", default=None,
                   help="comma-separated prompt-length cut points, e.g. 4096,16384: one "
                        "prefill batch holds one bucket only (default: none)")
    g.add_argument("--speculative", default=None, choices=["ngram", "mtp"],
                   help="speculative decoding: ngram (prompt lookup, any model) or mtp (the "
                        "model's MTP layers); default off")
    g.add_argument("--num-draft-tokens", type=int, default=4,
                   help="draft tokens verified per decoding request and step (mtp: "
                        "clamped to the model's MTP layer count)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--device", default="cpu")


def _tier_flags(t: argparse._ArgumentGroup) -> None:
    t.add_argument("--host-kv-cache-memory", default="0", metavar="SIZE",
                   help="host-memory KV tier (L2): pages the device pools evict go here, "
                        "SWA-only evictions included (e.g. 8GiB; default 0: none)")
    t.add_argument("--kv-storage", default=None, metavar="URL",
                   help="shared storage KV tier (L3): file:DIR, redis://HOST:PORT[/DB] or "
                        "redis-cluster://HOST:PORT[,HOST:PORT...]; prefixes are written as "
                        "their prefill runs and read back by any process serving the same "
                        "model (default: none)")
    t.add_argument("--kv-disk-cap", default=None, metavar="SIZE",
                   help="byte cap of a file: store; least recently used entries go first "
                        "(default: no cap)")
    t.add_argument("--kv-storage-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="deadline of one storage lookup or write batch; past it a lookup is "
                        "a miss and the request recomputes (default 2)")
    t.add_argument("--kv-keepalive", type=float, default=30.0, metavar="SECONDS",
                   help="refresh the storage keys of a prefix that hits in L1/L2 at most this "
                        "often, so a store with its own LRU keeps hot prefixes (0: off)")
    t.add_argument("--kv-storage-write", default="through", choices=["through", "off"],
                   help="through: write prefixes to storage as their prefill runs and when "
                        "their request ends; off: read only")
    t.add_argument("--kv-write-queue", type=int, default=64, metavar="N",
                   help="write batches waiting for storage; beyond it writes are dropped and "
                        "counted (default 64)")


def _buckets(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--length-buckets takes comma-separated integers, not {text!r}") \
            from None


def engine_opts(a: argparse.Namespace) -> dict:
    opts = dict(dtype=a.dtype, quantize=a.quantize, greedy_head=a.greedy_head,
                attention_backend=a.attention_backend, decode_graphs=a.decode_graphs,
                fused_decode=a.fused_decode, prefill_matmul=a.prefill_matmul, repack=a.repack,
                kv_cache_memory=a.kv_cache_memory,
                page_size=a.page_size, swa_share=a.swa_share, max_num_seqs=a.max_num_seqs,
                prefix_cache=a.prefix_cache, retention=a.retention,
                window_rebuild=a.window_rebuild, tool_pause_hold=a.tool_pause_hold,
                max_num_batched_tokens=a.max_num_batched_tokens,
                max_mixed_batched_tokens=a.max_mixed_batched_tokens, max_model_len=a.max_model_len,
                num_threads=a.threads, device=a.device, policy=a.policy,
                aging_per_second=a.aging_per_second, admission=a.admission,
                length_buckets=_buckets(a.length_buckets),
                speculative=a.speculative, num_draft_tokens=a.num_draft_tokens,
                host_kv_cache_memory=a.host_kv_cache_memory, kv_storage=a.kv_storage,
                kv_disk_cap=a.kv_disk_cap, kv_storage_timeout=a.kv_storage_timeout,
                kv_keepalive=a.kv_keepalive, kv_storage_write=a.kv_storage_write,
                kv_write_queue=a.kv_write_queue)
    if a.compile is not None:
        opts["compile"] = a.compile
    return opts


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """The HTTP server's flags (`python server.py`): listening, limits, media policy and
    logging. Engine flags come separately (`add_engine_flags`)."""
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000,
                   help="port to listen on (default 8000; 0: any free port)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: no auth)")
    g.add_argument("--served-model-name", default=None,
                   help="model id clients send and /v1/models lists (default: --model)")
    g.add_argument("--max-body-bytes", type=int, default=8 * 2**20,
                   help="largest request body accepted (HTTP 413 above)")
    g.add_argument("--max-in-flight", type=int, default=256,
                   help="requests inside the pipeline at once; more wait in a queue")
    g.add_argument("--max-queued", type=int, default=1024,
                   help="requests waiting beyond --max-in-flight; more get HTTP 503")
    g.add_argument("--gather-wait", type=float, default=0.02, metavar="SECONDS",
                   help="an idle engine waits at most this long for requests still being "
                        "tokenized, so that a burst's first step plans them together; a lone "
                        "request never waits (default 0.02; 0: start at the first arrival)")
    m = p.add_argument_group("media (vision-language models)")
    m.add_argument("--allowed-media-dir", action="append", default=[], metavar="DIR",
                   help="serve file:// URLs and plain paths under DIR (repeatable; default: "
                        "no local files)")
    m.add_argument("--allow-private-media-urls", action="store_true",
                   help="let media URLs reach loopback, private and link-local addresses "
                        "(default: refused, against SSRF)")
    m.add_argument("--max-media-bytes", type=int, default=64 * 2**20,
                   help="largest image or video accepted, per item (download, data: URL or "
                        "file; default 64 MiB)")
    m.add_argument("--image-max-pixels", type=int, default=None, metavar="N",
                   help="resize images to at most N pixels before encoding (N / 784 visual "
                        "tokens; default: the checkpoint's preprocessor_config.json bound)")
    m.add_argument("--embed-cache-bytes", type=int, default=512 * 2**20,
                   help="memory for cached vision-encoder outputs, per encoder worker "
                        "(default 512 MiB)")
    m.add_argument("--encoder-workers", type=int, default=1,
                   help="vision-encoder processes (default 1: the encoder runs in the server "
                        "process); N > 1 starts N processes, each loading the vision tower "
                        "and keeping its own --embed-cache-bytes cache, media routed to them "
                        "by consistent hashing of their content")
    m.add_argument("--encoder-worker", action="append", default=[], metavar="URL",
                   help="send media to this --role encoder worker instead of encoding here "
                        "(repeatable: items routed by --encoder-routing; a dead one's items "
                        "go to the next; HTTP 503 when none is left)")
    m.add_argument("--encoder-routing", default="hash", choices=["hash", "round-robin"],
                   help="how items pick an --encoder-worker: hash (default: consistent hashing "
                        "of the media hash, so a repeat reaches the cache that has it) or "
                        "round-robin")
    m.add_argument("--encoder-shm-cache-mb", type=int, default=0, metavar="MB",
                   help="a shared-memory embedding cache of MB MiB behind every encoder "
                        "process's own cache, shared by all encoder processes on this machine "
                        "that use the same --encoder-shm-name (default 0: off)")
    m.add_argument("--encoder-shm-name", default="mimo-embeds", metavar="NAME",
                   help="the shared embedding cache's files: /dev/shm/NAME.{seg,lock,users} "
                        "(default mimo-embeds; removed when its last user exits)")
    g.add_argument("--web-ui", action=argparse.BooleanOptionalAction, default=True,
                   help="serve the chat page at / (streaming chat, model picker, image "
                        "upload, stop button; its API calls send the key typed into it); "
                        "--no-web-ui: / answers 404")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    # ---- API
    g.add_argument("--body-read-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a client has to send its whole request body (HTTP 408 after)")
    g.add_argument("--metrics-public", action="store_true",
                   help="serve /metrics without the --api-key (default: it needs the key too)")
    g.add_argument("--default-max-tokens", type=int, default=None, metavar="N",
                   help="max_tokens of a request that sends none (default: none, the rest of "
                        "the context, as OpenAI)")
    r = p.add_argument_group("router (python -m mimo.router)")
    r.add_argument("--router-redis", default=None, metavar="URL",
                   help="publish this server's cache contents (page keys, SWA windows) and "
                        "load to the routers' Redis: redis://HOST:PORT[/DB] or "
                        "redis-cluster://HOST:PORT[,...] (default: off)")
    r.add_argument("--advertise-url", default=None, metavar="URL",
                   help="this server's URL as routers reach it (default http://HOST:PORT)")
    r.add_argument("--router-heartbeat", type=float, default=0.5, metavar="SECONDS",
                   help="seconds between heartbeats; a worker silent for 6 of them leaves "
                        "the routing set (default 0.5)")
    d = p.add_argument_group("disaggregated serving (docs/disaggregation.md)")
    d.add_argument("--role", default="both", choices=["both", "prefill", "decode", "encoder"],
                   help="both (default): prefill and decode here; prefill: also answer "
                        "/v1/internal/prefill with a prompt's KV (full layers, SWA windows "
                        "only) for a decode worker; decode: take a request's prompt KV from "
                        "the prefill worker the router names (local recompute if that fails); "
                        "encoder: only run the vision tower, for workers given "
                        "--encoder-worker (docs/encoders.md)")
    d.add_argument("--kv-transfer-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="decode role: longest a KV stream may stay silent before the request "
                        "is recomputed here (default 60)")
    d.add_argument("--prefill-peer", action="append", default=[], metavar="URL",
                   help="decode role: a prefill worker this worker may take KV from "
                        "(repeatable); a request naming another gets HTTP 403. Default: "
                        "loopback URLs only")
    rs = p.add_argument_group("responses (/v1/responses)")
    rs.add_argument("--responses-store", default=None, metavar="URL",
                    help="where stored responses live for previous_response_id, retrieve and "
                         "input_items: memory:// (default: this process only) or "
                         "redis://HOST:PORT[/DB] (every replica sharing it continues any "
                         "chain)")
    rs.add_argument("--responses-ttl", type=float, default=86400.0, metavar="SECONDS",
                    help="how long a stored response lives (default 86400: one day)")


def server_config(a: argparse.Namespace) -> ServerConfig:
    """Parsed server flags -> ServerConfig (the media flags go to the media config)."""
    return ServerConfig(host=a.host, port=a.port, api_key=a.api_key,
                        served_model_name=a.served_model_name,
                        max_body_bytes=a.max_body_bytes, max_in_flight=a.max_in_flight,
                        max_queued=a.max_queued, gather_wait=a.gather_wait,
                        embed_cache_bytes=a.embed_cache_bytes,
                        encoder_workers=a.encoder_workers,
                        encoder_urls=tuple(a.encoder_worker),
                        encoder_routing=a.encoder_routing,
                        encoder_shm_cache_mb=a.encoder_shm_cache_mb,
                        encoder_shm_name=a.encoder_shm_name,
                        # ---- API
                        body_read_timeout=a.body_read_timeout,
                        metrics_public=a.metrics_public,
                        default_max_tokens=a.default_max_tokens,
                        # ---- router
                        router_redis=a.router_redis, advertise_url=a.advertise_url,
                        router_heartbeat=a.router_heartbeat,
                        responses_store=a.responses_store, responses_ttl=a.responses_ttl,
                        web_ui=a.web_ui, role=a.role,
                        kv_transfer_timeout=a.kv_transfer_timeout,
                        prefill_peers=tuple(a.prefill_peer))
