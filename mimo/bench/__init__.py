"""Benchmarks: `python -m mimo.bench <name> --help`."""
from pathlib import Path

# The repository's copy of the Mooncake traces (data/README.md says where they come from).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DEFAULT_TRACE = DATA_DIR / "traces" / "conversation_trace.jsonl"


def add_trace_arg(p) -> None:
    """`--trace`, for the benchmarks that replay a Mooncake-format trace."""
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="Mooncake-format JSONL trace (default: the repository's conversation "
                        "trace, data/traces/conversation_trace.jsonl)")
