"""Benchmarks: `python -m mimo.bench <name> --help`."""
from pathlib import Path

# The repository's copy of the Mooncake traces (data/README.md says where they come from).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DEFAULT_TRACE = DATA_DIR / "traces" / "conversation_trace.jsonl"
