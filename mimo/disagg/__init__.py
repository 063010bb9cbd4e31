"""Disaggregated serving: prefill and decode workers, and the KV that moves between them.

A decode worker (`--role decode`) that receives a request naming a prefill worker (the
router's `x-mimo-prefill` header) asks that worker for the prompt's KV (`PrefillClient`):
the prefill worker (`--role prefill`, `PrefillEndpoint`) computes the prompt and its first
token and streams back the full layers' pages and each SWA layer's window only, in binary
frames of pages sent while the prompt is still being computed (`wire`, `KVSender`); the
decode worker holds them in host memory until its scheduler
admits the request, then decodes (`DecodeGenerate`). A transfer that fails or times out is
a local recompute. `roles` wires a server for its role.
"""
from .roles import ROLES, decode_stage, kv_fingerprint, role_routes
from .wire import Prefilled, TransferFailed

__all__ = ["ROLES", "Prefilled", "TransferFailed", "decode_stage", "kv_fingerprint",
           "role_routes"]
