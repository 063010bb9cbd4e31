"""The request side of tool calling: `tools` / `tool_choice` (spec) and the grammar a forced
choice is constrained to (grammar). Formats and output parsing: mimo.tools."""
from .grammar import forced_call
from .spec import Tool, ToolSpec, parse_tools

__all__ = ["Tool", "ToolSpec", "forced_call", "parse_tools"]
