"""Every Triton kernel of the zoo through Triton's compiler front end for an sm_90 (Hopper) target, on
this CPU: the step the interpreted tests (``TRITON_INTERPRET=1``) skip.

Why: the interpreter runs a kernel's Python as Python, so a kernel can pass every interpreted case and
still fail to compile on a GPU. It happened: the kernels' pointer arguments were annotated ``Any``,
which the interpreter ignores and Triton 3.6's compiler rejects ("Cannot access global variable Any
from within @jit'ed function"); the first GPU run (``benchmarks/gpu_check.sh``) found it. This test
fails on that code and passes on the fix, with no GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install triton): the Triton kernels are not compiled")

SCRIPT = Path(__file__).with_name("triton_frontend_cases.py")


def test_every_kernel_compiles_to_triton_ir() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a compiled JITFunction, not the interpreter's
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert len(results) == 12, results  # 4 diagonal-scan and 8 selective-scan variants
    failed = {name: msg for name, msg in results.items() if msg != "ok"}
    assert not failed, "\n\n".join(f"{name}: {msg}" for name, msg in failed.items())
