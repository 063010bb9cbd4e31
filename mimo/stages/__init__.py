"""The serving stages, one noun per file. Each follows the `mimo.pipeline` Stage contract and
reads and writes the declared fields of one typed request (chat_request.ChatRequest)."""
from .chat_request import ChatRequest, Usage
from .decode_media import DecodeMedia
from .detokenize import Detokenize, IncrementalDetokenizer, TextDelta
from .encode import EncodeStage
from .fetch import Fetch
from .generate import ContextLengthExceeded, Generate, Generated
from .preprocess import Preprocess
from .prompt import BuildPrompt

__all__ = ["BuildPrompt", "ChatRequest", "ContextLengthExceeded", "DecodeMedia", "Detokenize",
           "EncodeStage", "Fetch", "Generate", "Generated", "IncrementalDetokenizer",
           "Preprocess", "TextDelta", "Usage"]
