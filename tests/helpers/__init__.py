"""What the tests share, in one place: tiny models and prompts (tiny_models), reference
implementations and brute-force models (mtp_reference, radix_model), the model-free scheduler
harness (sched_harness), the engine fuzzer (engine_fuzz, also a command line), KV checks,
media files and a loopback media server (media, video), pipeline test stages (pipeline), real
Redis servers and a 3-master Redis Cluster on loopback ports (redis_servers).
Test files import them as `helpers.<module>` (pytest puts tests/ on the path)."""
