"""Tool calls as models write them: the per-family formats (formats), the incremental parser
that splits output into reasoning, text and calls (output), and the prompt text of tools
and calls for chat templates that have no tool support (prompt). No HTTP here: the API
(mimo.api.tools) reads requests and shapes responses with these."""
from .formats import FORMATS, ToolCall, ToolFormat, format_for
from .output import OutputParser, ParsedOutput

__all__ = ["FORMATS", "OutputParser", "ParsedOutput", "ToolCall", "ToolFormat", "format_for"]
