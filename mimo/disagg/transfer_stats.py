"""Counters of the KV transfers a worker made, served as JSON at /v1/internal/kv_transfers."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TransferStats:
    transfers: int = 0          # streams completed (sent by a prefill worker, or received)
    failed: int = 0             # transfers that failed (decode side: each became a recompute)
    wire_bytes: int = 0         # stream bytes (header, frames, trailer) of completed ones
    kv_bytes: int = 0           # tensor bytes among them
    full_kv_bytes: int = 0      # what a full-KV layout would hold for the same prompts
    seconds: float = 0.0        # decode side: request sent -> last byte received
    prefill_seconds: float = 0.0    # prefill side: request received -> prompt computed
    send_seconds: float = 0.0   # prefill side: handing the stream's bytes to the socket
    # prefill side: prompt computed -> last byte handed to the socket (the sending that did
    # not overlap the prefill)
    send_tail_seconds: float = 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["bytes_ratio"] = (self.wire_bytes / self.full_kv_bytes) if self.full_kv_bytes else None
        return out
