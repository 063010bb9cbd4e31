"""Lower KV tiers: host memory (L2) and storage backends (L3)."""
