"""One run-time self-test for a GPU kernel: the probe a backend registers (``probe=``).

A kernel that imports may still fail on a given driver, GPU or compiler; ``auto`` takes it only once
it has run here and matched a float64 reference, outputs and gradients alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

TOLERANCE = 1e-4  # relative error in the 2-norm, per compared tensor


def relative_error(out: Tensor, ref: Tensor) -> float:
    """``||out − ref|| / ||ref||`` with ``out`` brought to the reference's device and dtype."""
    ref = ref.detach()
    return ((out.detach().cpu().to(ref.dtype) - ref).norm() / ref.norm()).item()


def gpu_self_test(what: str, run: Callable[[], Sequence[tuple[Tensor, Tensor]]], tolerance: float = TOLERANCE) -> str | None:
    """None if CUDA is here and every (kernel result, reference) pair ``run()`` returns agrees within
    ``tolerance``; else the reason, naming ``what`` ("the Triton selective scan"). Never raises."""
    if not torch.cuda.is_available():
        return "CUDA is not available in this torch build or machine"
    try:
        err = max(relative_error(out, ref) for out, ref in run())
    except Exception as exc:  # noqa: BLE001 - a broken driver or compiler raises anything
        return f"{what} failed a test run on this GPU ({type(exc).__name__}: {exc})"
    if not math.isfinite(err) or err > tolerance:
        return f"{what} disagrees with the reference on this GPU (relative error {err:.1e})"
    return None
