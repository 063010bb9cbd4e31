"""mimo: a serving engine for hybrid sliding-window-attention language models."""
import os

# OpenMP workers (torch's and the CPU kernels') spin after each parallel region before they
# sleep; libgomp's default of 300,000 spins keeps a core busy for milliseconds after every
# call, stealing it from other threads and processes between decode steps. 10,000 spins
# bridge the gaps within a step (tens of microseconds) and sleep soon after. libgomp reads
# this once, when torch loads it: it takes effect when mimo is imported before torch.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from .engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name):
    # Importing the LLM pulls in torch and the model code; keep `import mimo` light.
    if name == "LLM":
        from .llm import LLM
        return LLM
    raise AttributeError(name)
