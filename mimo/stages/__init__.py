"""The serving stages, one noun per file. Each follows the `mimo.pipeline` Stage contract."""
from .detokenize import Detokenize, IncrementalDetokenizer
from .generate import Generate
from .tokenize import Tokenize

__all__ = ["Tokenize", "Generate", "Detokenize", "IncrementalDetokenizer"]
