"""families.py: every family module declares one Architecture under its own name, lookups by
model_type / GGUF architecture / arch name find it, and the model modules import one another
without cycles (no model needed)."""
import ast
import importlib
from pathlib import Path

import pytest

from mimo.config import ConfigError, ModelConfig
from mimo.models import families, make_tiny, registry
from mimo.models.hf_config import model_config_from_hf

MODELS_DIR = Path(importlib.import_module("mimo.models").__file__).parent


def test_each_family_module_declares_its_architecture():
    archs = families.architectures()
    assert sorted(archs) == sorted(families.MODULES)
    for name, a in archs.items():
        assert importlib.import_module(f"mimo.models.{name}").ARCHITECTURE is a
        assert all(families.by_model_type(t) is a for t in a.model_types)


def test_no_model_type_is_claimed_twice():
    types = [t for a in families.architectures().values() for t in a.model_types]
    assert len(types) == len(set(types))


def test_unknown_names_fail_clearly():
    with pytest.raises(ConfigError, match="supported: gemma3, gemma3_text, llama"):
        model_config_from_hf({"model_type": "no_such_model"})
    cfg = ModelConfig(arch="no_such_arch", vocab_size=8, hidden_size=8, intermediate_size=8,
                      num_layers=1, num_heads=1, layer_types=("full",), full_kv_heads=1,
                      swa_kv_heads=1, head_dim=8, v_head_dim=8, swa_head_dim=8,
                      swa_v_head_dim=8, sliding_window=8, rope_theta=1e4, rope_local_theta=1e4)
    with pytest.raises(registry.ModelNotFound, match="no_such_arch"):
        registry.build_model(cfg, {}, None)


def test_tiny_writers_and_gguf_readers_come_from_the_families():
    archs = families.architectures().values()
    assert make_tiny.available() == sorted(a.name for a in archs if a.tiny is not None)
    assert sorted(families.gguf_formats()) == ["gemma3", "llama"]


def _relative_imports(path: Path) -> set[str]:
    """Sibling modules of mimo/models that `path` imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            out |= {n.split(".")[0] for n in names}
    return out


def test_model_modules_import_without_cycles():
    graph = {p.stem: _relative_imports(p) for p in MODELS_DIR.glob("*.py")}
    # families.py imports the family modules by name (importlib), not by an import statement.
    graph["families"] |= set(families.MODULES)
    seen, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(m):] + [m])}")
        if m in seen or m not in graph:
            return
        stack.append(m)
        for d in sorted(graph[m]):
            visit(d)
        stack.pop()
        seen.add(m)

    for m in sorted(graph):
        visit(m)
