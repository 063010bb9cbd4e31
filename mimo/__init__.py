"""mimo: a serving engine for hybrid sliding-window-attention language models."""
from .engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name):
    # Importing the LLM pulls in torch and the model code; keep `import mimo` light.
    if name == "LLM":
        from .llm import LLM
        return LLM
    raise AttributeError(name)
