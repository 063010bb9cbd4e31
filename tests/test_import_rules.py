"""The dependency rule of docs/architecture.md, enforced: every import in mimo/ (function
bodies and TYPE_CHECKING blocks included), read with `ast`, must follow an arrow drawn there.
The tables below are the rule; change them only together with that document."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "mimo"
ANY = frozenset({"*"})

# Which top-level units of mimo/ (a package or a module) each one may import.
ALLOWED: dict[str, frozenset[str]] = {
    # leaves: data and small shared helpers
    "config": frozenset({"cpu"}),           # only cpu.features (NARROW): resolves dtype=auto
    "redis_client": frozenset(),
    "pipeline": frozenset(),
    "structured": frozenset(),
    "tools": frozenset(),
    "cpu": frozenset({"config"}),
    # compute and bookkeeping
    "gpu": frozenset({"config", "cpu"}),
    "models": frozenset({"config", "cpu", "gpu"}),
    "kvcache": frozenset({"config", "redis_client"}),
    "multimodal": frozenset({"config", "models"}),
    # the engine, with its speculative-decoding plug-in (each builds on the other)
    "engine": frozenset({"config", "cpu", "gpu", "kvcache", "models", "multimodal", "spec",
                         "structured", "redis_client", "router"}),  # router: NARROW
    "spec": frozenset({"config", "cpu", "gpu", "kvcache", "models", "engine", "structured"}),
    # request handling, through the engine's face only (PUBLIC_ENGINE)
    "stages": frozenset({"config", "pipeline", "engine", "kvcache", "models", "multimodal",
                         "tools", "structured"}),
    "api": frozenset({"config", "pipeline", "stages", "engine", "kvcache", "models",
                      "multimodal", "tools", "structured"}),
    # the router reaches workers over HTTP and Redis only: no engine, no kernels
    "router": frozenset({"config", "api", "stages", "pipeline", "kvcache", "models",
                         "multimodal", "tools", "structured", "redis_client"}),
    # disaggregated serving moves KV between engines: an engine-side peer of api
    "disagg": frozenset({"config", "cpu", "gpu", "kvcache", "models", "engine", "api",
                         "pipeline", "stages", "redis_client"}),
    # entry points and tools on top
    "flags": frozenset({"config", "cpu"}),
    "llm": frozenset({"config", "engine", "kvcache", "models", "multimodal", "structured"}),
    "bench": ANY,
    "__main__": ANY,
    "__init__": ANY,
}
# Imports narrower than a whole unit: importer unit -> modules it may name in that unit.
NARROW = {("config", "cpu"): {"mimo.cpu.features"},
          # the worker's cache publisher writes the Redis names the router reads
          ("engine", "router"): {"mimo.router.cache_events"}}
# Modules both sides of a narrow arrow share: they import nothing of mimo.
LEAVES = {"mimo.router.cache_events"}
# What api, stages and router may import of the engine: its face, nothing of its insides.
PUBLIC_ENGINE = {"mimo.engine", "mimo.engine.face", "mimo.engine.async_engine",
                 "mimo.engine.sampling_params", "mimo.engine.errors"}
FACE_ONLY = {"api", "stages", "router"}
# The KV bookkeeping is tested with no model: it never imports one, nor the kernels.
BOOKKEEPING = ("mimo.kvcache", "mimo.engine.scheduler", "mimo.engine.policy",
               "mimo.engine.sequence", "mimo.engine.scheduled_chunk",
               "mimo.engine.prefill_planner")
NO_MODEL = ("mimo.models", "mimo.gpu", "mimo.spec")


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def _is_module(name: str) -> bool:
    p = ROOT.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports_of(source: str, module: str, is_pkg: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import of a mimo module in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_pkg:
                    base = base[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:         # `from pkg import module` names the module itself
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub) else target))
    return sorted({(n, m) for n, m in out if m == "mimo" or m.startswith("mimo.")})


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def violations(module: str, is_pkg: bool, source: str) -> list[str]:
    src, bad = unit(module), []
    if module == "mimo.__main__":
        src = "__main__"
    for line, target in imports_of(source, module, is_pkg):
        dst = unit(target)
        where = f"{module}:{line} imports {target}"
        if module in LEAVES:
            bad.append(f"{where}: {module} is a leaf (imports nothing of mimo)")
            continue
        if not _is_module(target):
            bad.append(f"{where}: no such module (a relative import gone stale?)")
            continue
        if dst == src or dst == "__init__" and src in ALLOWED["__init__"]:
            continue
        allowed = ALLOWED.get(src)
        if allowed is None:
            bad.append(f"{where}: mimo/{src} has no row in the dependency rule "
                       f"(docs/architecture.md, tests/test_import_rules.py ALLOWED)")
        elif allowed != ANY and dst not in allowed:
            bad.append(f"{where}: {src} may not import {dst}")
        elif (src, dst) in NARROW and target not in NARROW[src, dst]:
            bad.append(f"{where}: {src} may import only {sorted(NARROW[src, dst])} of {dst}")
        elif src in FACE_ONLY and dst == "engine" and target not in PUBLIC_ENGINE:
            bad.append(f"{where}: outside the engine only its face may be imported "
                       f"({', '.join(sorted(PUBLIC_ENGINE))})")
        if module.startswith(BOOKKEEPING) and target.startswith(NO_MODEL):
            bad.append(f"{where}: the KV bookkeeping never imports a model or kernels")
    return bad


def all_violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        module, is_pkg = module_name(path)
        bad += violations(module, is_pkg, path.read_text(encoding="utf-8"))
    return bad


def test_every_import_follows_the_dependency_rule():
    bad = all_violations()
    assert not bad, "dependency rule broken (docs/architecture.md):\n" + "\n".join(bad)


def test_every_unit_has_a_row():
    units = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert units <= set(ALLOWED), f"no rule for {sorted(units - set(ALLOWED))}"


@pytest.mark.parametrize("module,is_pkg,source,expect", [
    # the checker itself, on the breaks it exists to catch
    ("mimo.config", False, "from .kvcache.radix.retention import POLICIES",
     "config may not import kvcache"),
    ("mimo.config", False, "def f():\n    from .cpu.build import x", "may import only"),
    ("mimo.gpu.paged_metadata", False,
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine.scheduler import S",
     "gpu may not import engine"),
    ("mimo.router.state", False, "from ..engine.cache_publisher import open_redis",
     "router may not import engine"),
    ("mimo.api.app", False, "from ..engine import engine", "only its face"),
    ("mimo.stages.generate", False, "import mimo.engine.scheduler", "only its face"),
    ("mimo.kvcache.pool.kv_pool", False, "from ...models import registry",
     "kvcache may not import models"),
    ("mimo.engine.cache_publisher", False, "from ..router.state import RouterState",
     "may import only ['mimo.router.cache_events']"),
    ("mimo.router.cache_events", False, "from ..kvcache.tiers.keys import FULL", "is a leaf"),
    ("mimo.engine.scheduler", False, "from ..gpu.attention import A", "bookkeeping never"),
    ("mimo.newpkg", True, "from ..engine import face", "has no row"),
    ("mimo.config", True, "def f():\n    from .cpu.features import cpu_info", "no such module"),
])
def test_checker_catches(module, is_pkg, source, expect):
    bad = violations(module, is_pkg, source)
    assert any(expect in b for b in bad), bad


def test_checker_accepts_the_drawn_arrows():
    assert violations("mimo.api.app", False, "from ..engine.face import EngineInfo\n"
                      "from ..stages import Generate\nfrom ..pipeline import Stage") == []
    assert violations("mimo.engine.runner", False, "from ..gpu.attention import A\n"
                      "from .scheduler import S") == []
    assert violations("mimo.kvcache.tiers", True, "from ..pool.layout import KVLayout") == []
    assert violations("mimo.engine.cache_publisher", False,
                      "from ..router import cache_events as ce") == []
