"""The Triton diagonal scan (``zoo_core.kernels.triton_diag``) against ``scan_naive``: every state, the
final one and every gradient (a, b, h0), real and complex, time-varying and time-invariant a, with
resets; and its backend's refusals.

The kernel runs in a subprocess (``triton_diag_cases.py``): under ``TRITON_INTERPRET=1`` on CPU (Triton
reads it when a kernel is decorated, so it must be set before the module is first imported: a fresh
process guarantees it) and, where this machine has CUDA, compiled on the GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from zoo_core.plugin_registry import Problem
from zoo_core.plugins import get_registry

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install triton); the Triton diagonal scan is untested")

SCRIPT = Path(__file__).with_name("triton_diag_cases.py")
CASES = [f"{c}-{t}{r}" for c in ("real", "complex") for t in ("time-varying", "time-invariant") for r in ("", "-reset")]
CASES += ["real-a-complex-b-no-h0", "one-state-dim-L1", "default-block-broadcast-S", "opcheck"]
DEVICES = ["cpu-interpreted"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=DEVICES)
def report(request: Any) -> dict[str, Any]:
    env = dict(os.environ)
    if request.param == "cuda":
        env.pop("TRITON_INTERPRET", None)
    else:
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    device = "cuda" if request.param == "cuda" else "cpu"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", device], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"triton_diag_cases.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_every_case_ran(report: dict[str, Any]) -> None:
    assert sorted(report) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_triton_diag_equals_naive(report: dict[str, Any], case: str) -> None:
    result = report[case]
    assert "error" not in result, f"{result['error']}\n{result.get('traceback', '')}"
    bad = {k: f"{e:.2e}" for k, e in result["errors"].items() if not e <= result["tol"]}  # NaN fails too
    assert not bad, f"relative errors above {result['tol']:.0e}: {bad}"


def test_backend_refuses_cpu_and_other_structures() -> None:
    reg = get_registry()
    entry = reg.backend("scan", "triton-diag")
    assert entry.requires == ("triton",) and "triton" in entry.aliases
    assert "CUDA tensors only" in (entry.supports(Problem(structure="diag", device="cpu")) or "")
    assert "diag" in (entry.supports(Problem(structure="block2x2", device="cuda")) or "")
    if not torch.cuda.is_available():
        assert "CUDA is not available" in (entry.supports(Problem(structure="diag", device="cuda")) or "")
    # on a CPU, auto never takes it
    assert all(e.name != "triton-diag" for e in reg.backends_for("scan", "cpu") if e.supports(Problem(structure="diag")) is None)


def test_auto_takes_it_on_a_gpu_that_passed_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo_core.kernels import triton_diag  # decorates the kernel here, but never runs it in this process

    monkeypatch.setattr(triton_diag, "triton_runtime_reason", lambda: None)
    reg = get_registry()
    cuda = Problem(structure="diag", lti=False, device="cuda")
    best = next(e for e in reg.backends_for("scan", "cuda") if e.supports(cuda) is None)
    assert best.name == "triton-diag"
    assert reg.backend("scan", "triton", cuda).name == "triton-diag"  # the spec name, for a diagonal core
