"""The serving stages, one noun per file. Each follows the `mimo.pipeline` Stage contract."""
from .decode_media import DecodeMedia
from .detokenize import Detokenize, IncrementalDetokenizer
from .encode import EncodeStage
from .fetch import Fetch
from .generate import Generate
from .media_prompt import MediaPrompt
from .preprocess import Preprocess, PreprocessedMedia
from .tokenize import Tokenize

__all__ = ["Fetch", "DecodeMedia", "Preprocess", "PreprocessedMedia", "Tokenize", "EncodeStage",
           "MediaPrompt", "Generate",
           "Detokenize", "IncrementalDetokenizer"]
