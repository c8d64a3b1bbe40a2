"""The Triton selective scan (``zoo_mamba.triton_scan``) against the naive loop: outputs, final
states and every gradient (u, Δ, A, B, C, D, h0), input-dependent and time-invariant B/C, with and
without D and h0, packed documents, odd sizes; and its backend's refusals on CPU problems.

The kernels run in a subprocess (``triton_cases.py``): on CPU under ``TRITON_INTERPRET=1``, which
Triton reads when a kernel is decorated, so it must be set before ``zoo_mamba.triton_scan`` is first
imported, which a fresh process guarantees whatever pytest imported earlier; and, where this machine
has CUDA, compiled on the GPU. One subprocess per device serves every case (the interpreter is slow
to start); each case is its own test.
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

from zoo_core.backends import resolve
from zoo_core.errors import BackendUnavailableError
from zoo_core.plugin_registry import Problem
from zoo_core.plugins import get_registry
from zoo_mamba.core import Mamba

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install 'zoo-mamba[triton]'); the Triton kernels are untested")

SCRIPT = Path(__file__).with_name("triton_cases.py")
CASES = ["input-dependent", "length-1", "one-chunk-default-blocks", "two-chunks-default", "chunk-1", "static-B-C-no-D-no-h0",
         "static-B-h0", "static-C-no-D", "N-1-block-8", "N-16", "packed", "packed-not-last-static", "final-state-only",
         "packed-ends-only", "float32", "opcheck"]
DEVICES = ["cpu-interpreted"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=DEVICES)
def report(request: Any) -> dict[str, Any]:
    env = dict(os.environ)
    if request.param == "cuda":
        env.pop("TRITON_INTERPRET", None)
        device = "cuda"
    else:
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        device = "cpu"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", device], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"triton_cases.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_every_case_ran(report: dict[str, Any]) -> None:
    assert sorted(report) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_triton_equals_naive(report: dict[str, Any], case: str) -> None:
    result = report[case]
    assert "error" not in result, f"{result['error']}\n{result.get('traceback', '')}"
    bad = {k: f"{e:.2e}" for k, e in result["errors"].items() if not e <= result["tol"]}  # NaN fails too
    assert not bad, f"relative errors above {result['tol']:.0e}: {bad}"


# the backend --------------------------------------------------------------------------------
def test_backend_is_registered_between_chunked_and_mamba_ssm() -> None:
    reg = get_registry()
    entry = reg.backend("scan", "selective-triton")
    assert "triton" in entry.aliases and entry.requires == ("triton",)
    assert reg.backend("scan", "selective-chunked").priority < entry.priority < reg.backend("scan", "selective-cuda").priority


def test_backend_refuses_cpu_problems_with_a_reason() -> None:
    entry = get_registry().backend("scan", "selective-triton")
    assert entry.unavailable_reason() is None
    assert "CUDA tensors only" in (entry.supports(Problem(structure="selective", lti=False, device="cpu")) or "")
    assert "selective" in (entry.supports(Problem(structure="diag", lti=False, device="cuda")) or "")
    assert "triton" not in Mamba(4).backend_choice.label()  # auto on CPU never takes it
    with pytest.raises(BackendUnavailableError, match="CUDA tensors only"):
        Mamba(4, backend="triton")


def test_cuda_problem_needs_the_runtime_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo_mamba import triton_scan  # decorates the kernels here, but never runs them in this process

    entry = get_registry().backend("scan", "selective-triton")
    cuda = Problem(structure="selective", lti=False, device="cuda")
    if not torch.cuda.is_available():
        assert "CUDA is not available" in (entry.supports(cuda) or "")
    monkeypatch.setattr(triton_scan, "triton_runtime_reason", lambda: None)  # a GPU where the probe passed
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)  # and no mamba-ssm: the Triton kernel is auto's choice
    reg = get_registry()
    if reg.backend("scan", "selective-cuda").supports(cuda) is None:
        pytest.skip("mamba-ssm's kernel works here and outranks the Triton one")
    choice = resolve("auto", paths=Mamba.paths, prefer=Mamba.prefer, reference=Mamba.reference, problem=cuda, who="test")
    assert choice.label() == "selective: scan=selective-triton"
    monkeypatch.setattr(triton_scan, "triton_runtime_reason", lambda: "disagrees with the reference (test)")
    choice = resolve("auto", paths=Mamba.paths, prefer=Mamba.prefer, reference=Mamba.reference, problem=cuda, who="test")
    assert "triton" not in choice.label()
