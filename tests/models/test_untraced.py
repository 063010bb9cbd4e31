"""`@untraced` keeps torch._dynamo out of start-up and still fences functions off once armed."""
import subprocess
import sys

from mimo.models import untraced as u


def test_model_import_does_not_import_dynamo():
    code = "import sys, mimo.models.gemma3, mimo.models.moe; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_armed_function_is_a_graph_break_and_still_runs():
    @u.untraced
    def side(x):
        return x * 2

    def f(x):
        return side(x + 1) - 1

    import torch._dynamo
    x = torch.arange(4.0)
    u.arm()
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 1       # the graph stops at `side` and resumes after
    assert torch.equal(torch.compile(f, backend="eager")(x), (x + 1) * 2 - 1)
    assert getattr(side.__wrapped__, "__name__", "") == "side"
