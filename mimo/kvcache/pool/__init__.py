"""The KV pools: page accounting (free / evictable / in use), the full and SWA pools of a
hybrid model (DualPool), a sequence's pages (SeqKV), the layout that sizes them, and the
only torch of the bookkeeping (KVTensors, SlotMap). docs/architecture.md has the tour."""
