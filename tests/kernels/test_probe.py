"""The shared GPU self-test behind the Triton backends' probes: every way it says no, and its yes."""

from __future__ import annotations

import pytest
import torch

from zoo_core.kernels.probe import gpu_self_test


def test_no_cuda_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_self_test("k", lambda: []) == "CUDA is not available in this torch build or machine"


@pytest.fixture
def cuda_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_agreement_within_tolerance_passes(cuda_here: None) -> None:
    ref = torch.randn(5, dtype=torch.float64)
    assert gpu_self_test("k", lambda: [(ref.float(), ref), ((ref * 1j).to(torch.complex64), ref * 1j)]) is None


def test_disagreement_and_nan_name_the_kernel_and_the_error(cuda_here: None) -> None:
    ref = torch.ones(4, dtype=torch.float64)
    said = gpu_self_test("the Triton thing", lambda: [(ref.float(), ref), (ref * 1.01, ref)])
    assert said == "the Triton thing disagrees with the reference on this GPU (relative error 1.0e-02)"
    nan = gpu_self_test("k", lambda: [(ref * float("nan"), ref)])
    assert nan is not None and "relative error nan" in nan


def test_a_raising_run_is_a_reason_not_an_exception(cuda_here: None) -> None:
    def run() -> list[tuple[torch.Tensor, torch.Tensor]]:
        raise RuntimeError("no kernel image is available for execution on the device")

    said = gpu_self_test("k", run)
    assert said == "k failed a test run on this GPU (RuntimeError: no kernel image is available for execution on the device)"
