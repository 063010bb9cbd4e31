"""The built-in vision families, one adapter file each; importing this package registers
them (`adapter.adapter_for` does on first use)."""
from . import qwen2_5_vl  # noqa: F401
