"""python -m mimo.bench.gpu_check (scripts/gpu_check.sh runs it): the one check a GPU machine
gets, with nothing fetched from the network. Three phases, each recorded even when an earlier
one failed:

- kernels: the Triton kernel tests and the device-preprocessing tests, compiled on the device
  (TRITON_INTERPRET=0), as pytest runs them;
- model: the tiny Gemma 3 and tiny MiMo-V2-Flash (weights made in code, float32) generate
  greedy tokens on the device through the Triton backend, with decode graphs off and, where
  the model allows capture, on; each must give the torch backend's tokens there;
- speed: a Gemma-3-270M-shaped model with random weights (bfloat16, made in code), Triton
  backend: decode tokens/s at each stream count and a prefill of one long prompt, with
  decode graphs on and off.

The last line of stdout is one JSON object (`ok`, `device`, `torch`, `triton`, `kernels`,
`model`, `speed`, `errors`); progress goes to stderr. Exit status 0 when every phase run
passed, 1 when one failed, 2 on bad arguments or no CUDA device.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("kernels", "model", "speed")
KERNEL_TESTS = ["tests/gpu", "-k", "triton", "tests/multimodal/test_device_preprocess.py"]


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, not {text!r}")
    return vals


def _phases(text: str) -> list[str]:
    out = [p for p in text.split(",") if p]
    bad = [p for p in out if p not in PHASES]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"phases are {', '.join(PHASES)}; not {text!r}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh",
        description="The GPU machine's check: kernel tests compiled on the device, the tiny "
                    "models there against the torch backend, a short speed run (decode "
                    "graphs on and off). Fetches nothing; prints one JSON line last.")
    p.add_argument("--phases", type=_phases, default=list(PHASES),
                   help=f"comma-separated subset of {','.join(PHASES)} (default: all)")
    p.add_argument("--device", default="cuda", help="torch device (must be CUDA)")
    p.add_argument("--streams", type=_ints, default=[1, 64], help="decode stream counts")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens each stream decodes")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt of each decode stream")
    p.add_argument("--prefill-tokens", type=int, default=16384, help="the long prompt's tokens")
    p.add_argument("--pytest-timeout", type=int, default=420, help="seconds for the kernel tests")
    p.add_argument("--pytest-log", default=None, metavar="PATH",
                   help="write the kernel tests' whole output here (stderr gets its end)")
    a = p.parse_args(argv)
    for name in ("decode_tokens", "prompt_tokens", "prefill_tokens", "pytest_timeout"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return a


def parse_pytest_summary(text: str) -> dict:
    """Counts from pytest's last summary line ('3 passed, 1 failed, 2 skipped in 4.2s')."""
    counts = {k: 0 for k in ("passed", "failed", "errors", "skipped")}
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", text):
        counts["errors" if word.startswith("error") else word] = int(n)
    return counts


def kernels_phase(timeout: int, log: str | None = None) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0", "HF_HUB_OFFLINE": "1", "MIMO_COMPILE": "off"}
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-rfE", *KERNEL_TESTS], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=timeout)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        # (its output arrives as bytes even under text=True)
        raw = e.stdout or b""
        out, rc = raw.decode(errors="replace") if isinstance(raw, bytes) else raw, 124
    sys.stderr.write(out[-4000:])
    if log:
        Path(log).write_text(out)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    return {"rc": rc, **parse_pytest_summary(out.strip().splitlines()[-1] if out.strip() else ""),
            "failed_tests": failed[:20], "seconds": round(time.perf_counter() - t0, 1)}


def summarize(info: dict, results: dict, errors: list[str]) -> dict:
    """The JSON line: every phase's result (None when not run), `ok` when all that ran passed."""
    ok = not errors and all(v.get("ok", v.get("rc") == 0) for v in results.values()
                            if v is not None)
    return {"ok": ok, **info, **{p: results.get(p) for p in PHASES}, "errors": errors}


def device_info(device: str) -> dict:
    """Versions and the device's name; SystemExit(2) with the JSON line when no CUDA device."""
    import torch
    info: dict = {"device": None, "torch": torch.__version__, "triton": None}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        why = (f"no CUDA device: torch {torch.__version__} sees "
               f"{torch.cuda.device_count()} GPU(s) and --device is {device!r}; this check "
               f"runs only on a GPU machine")
        print(json.dumps(summarize(info, {}, [why])))
        print(f"gpu_check: {why}", file=sys.stderr)
        raise SystemExit(2)
    info["device"] = torch.cuda.get_device_name(torch.device(device))
    return info


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    info = device_info(a.device)
    results: dict = {}
    errors: list[str] = []
    for phase in a.phases:
        print(f"gpu_check: {phase} ...", file=sys.stderr, flush=True)
        try:
            if phase == "kernels":
                results[phase] = kernels_phase(a.pytest_timeout, a.pytest_log)
            elif phase == "model":
                from .gpu_check_runs import model_phase
                results[phase] = model_phase(a.device)
            else:
                from .gpu_check_runs import speed_phase
                results[phase] = speed_phase(a.device, a.streams, a.prompt_tokens,
                                             a.decode_tokens, a.prefill_tokens)
        except Exception as e:  # noqa: BLE001 - recorded in the JSON line, next phase runs
            errors.append(f"{phase}: {type(e).__name__}: {e}")
            results[phase] = {"ok": False}
    line = summarize(info, results, errors)
    print(json.dumps(line), flush=True)
    return 0 if line["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
