"""The Triton kernels' tests run on CPU tensors through Triton's interpreter: TRITON_INTERPRET
must be set before any `@triton.jit` decorator runs (Triton reads it there), i.e. before
mimo.gpu.triton_* is first imported; this conftest loads before the test modules of tests/gpu.
On a GPU machine, TRITON_INTERPRET=0 in the environment runs them compiled, on CUDA tensors."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="session")
def triton_device() -> str:
    """Where the Triton tests run: CUDA when compiled kernels can, else the CPU, where the
    kernels must be interpreted (a module imported before the variable was set is not)."""
    pytest.importorskip("triton")
    from mimo.gpu import triton_extend
    interpreted = type(triton_extend._extend_kernel).__name__ == "InterpretedFunction"
    if interpreted:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.fail("mimo.gpu.triton_extend was imported before TRITON_INTERPRET=1 was set: "
                "its kernels cannot run on CPU")
