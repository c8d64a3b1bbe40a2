"""The optional pykeops Cauchy backend: availability without pykeops, and (when installed) outputs
and gradients against kernel_cauchy.

The availability tests fake an absent, a broken and a working pykeops, so they run whether or not
pykeops is installed; CI does not install it. Only the maths test needs the real package.

Letters: H channels, M stored half state, L length.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import pytest
import torch

from zoo_core.backends import resolve
from zoo_core.errors import BackendUnavailableError
from zoo_core.kernels import keops
from zoo_core.kernels.dplr import kernel_cauchy
from zoo_core.kernels.systems import DPLRSystem
from zoo_core.plugin_registry import Problem
from zoo_core.plugins import load_registry
from zoo_core.testing import assert_close
from zoo_s4.core import S4

_REAL_FIND_SPEC = importlib.util.find_spec


def _s4_kernel(registry, setting="auto"):  # type: ignore[no-untyped-def]
    """The kernel backend S4's own resolution picks from ``registry``."""
    choice = resolve(setting, paths=S4.paths, prefer=S4.prefer, reference=S4.reference,
                     problem=S4.problem, who="core 's4'", registry=registry)
    return choice.entries["kernel"].name


@pytest.fixture
def fresh_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget this process's cached run-time verdict for the duration of one test."""
    monkeypatch.setattr(keops, "_CHECKED", [])


@pytest.fixture
def absent(monkeypatch: pytest.MonkeyPatch, fresh_check: None) -> None:
    """pykeops is not installed, and nothing may try to run it."""
    def find_spec(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None if name.split(".")[0] == "pykeops" else _REAL_FIND_SPEC(name, *args, **kwargs)

    def must_not_run() -> str | None:
        raise AssertionError("the run-time check ran although pykeops is absent")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(keops, "_self_test", must_not_run)


def _present(monkeypatch: pytest.MonkeyPatch, torch_module: types.ModuleType | None) -> None:
    """Pretend pykeops is installed; ``pykeops.torch`` is ``torch_module`` (None: its import fails)."""
    def find_spec(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "pykeops":
            return importlib.machinery.ModuleSpec("pykeops", None)
        return _REAL_FIND_SPEC(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, "pykeops", types.ModuleType("pykeops"))
    monkeypatch.setitem(sys.modules, "pykeops.torch", torch_module)


class _NoCompiler:
    """A LazyTensor whose formula cannot be compiled, as on a machine without a C++ compiler."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("[KeOps] Error: could not compile formula (g++ not found)")


# without pykeops ---------------------------------------------------------------------------------
def test_backend_is_listed() -> None:
    entry = load_registry().backend("kernel", "keops")
    assert entry.target == "zoo_core.kernels.keops:kernel_cauchy_keops"
    assert entry.requires == ("pykeops",)
    # below cauchy: on this CPU the torch Cauchy kernel is 1.5-1.8x faster (benchmarks/REPORT_S4.md)
    assert entry.priority < load_registry().backend("kernel", "cauchy").priority
    assert "pykeops" in entry.description


def test_unavailable_reason_names_the_package(absent: None) -> None:
    entry = load_registry().backend("kernel", "keops")
    assert "pykeops" in (entry.unavailable_reason() or "")
    assert "pykeops" in (entry.supports(Problem(structure="dplr")) or "")
    reason = keops.runtime_reason()
    assert reason is not None and "pykeops" in reason and "pip install" in reason


def test_auto_skips_it_without_pykeops(absent: None) -> None:
    reg = load_registry()
    assert _s4_kernel(reg) == "cauchy"
    with pytest.raises(BackendUnavailableError, match="pykeops"):
        _s4_kernel(reg, "keops")


def test_it_serves_dplr_only(absent: None) -> None:
    entry = load_registry().backend("kernel", "keops")
    reason = entry.supports_fn(Problem(structure="diag"))  # type: ignore[misc]
    assert reason is not None and "dplr" in reason
    assert "time-invariant" in (entry.supports_fn(Problem(structure="dplr", lti=False)) or "")  # type: ignore[misc]


# installed, but broken or working --------------------------------------------------------------
def test_broken_import_is_a_reason(monkeypatch: pytest.MonkeyPatch, fresh_check: None) -> None:
    _present(monkeypatch, None)
    reg = load_registry()
    reason = reg.backend("kernel", "keops").supports(Problem(structure="dplr"))
    assert reason is not None and "import failed" in reason
    assert _s4_kernel(reg) == "cauchy"


def test_failed_runtime_check_is_a_reason(monkeypatch: pytest.MonkeyPatch, fresh_check: None) -> None:
    _present(monkeypatch, types.SimpleNamespace(LazyTensor=_NoCompiler))  # type: ignore[arg-type]
    reg = load_registry()
    reason = reg.backend("kernel", "keops").supports(Problem(structure="dplr"))
    assert reason is not None and reason.startswith("pykeops imports but failed its run-time check")
    assert "g++ not found" in reason
    assert _s4_kernel(reg) == "cauchy"


def test_wrong_answer_is_a_reason(monkeypatch: pytest.MonkeyPatch, fresh_check: None) -> None:
    _present(monkeypatch, types.SimpleNamespace(LazyTensor=object))  # type: ignore[arg-type]
    monkeypatch.setattr(keops, "_cauchy_sums", lambda v, *_: torch.zeros_like(v[..., :1]).expand(*v.shape[:2], 9))
    reason = keops.runtime_reason()
    assert reason is not None and "relative error" in reason


def test_passing_check_is_cached_and_makes_it_selectable(monkeypatch: pytest.MonkeyPatch,
                                                          fresh_check: None) -> None:
    _present(monkeypatch, types.SimpleNamespace(LazyTensor=object))  # type: ignore[arg-type]
    calls: list[int] = []
    monkeypatch.setattr(keops, "_self_test", lambda: calls.append(1))  # returns None: passed
    reg = load_registry()
    assert reg.backend("kernel", "keops").supports(Problem(structure="dplr")) is None
    assert _s4_kernel(reg, "keops") == "keops"
    assert _s4_kernel(reg) == "cauchy"  # auto prefers the faster torch kernel on this CPU
    assert len(calls) == 1


# with pykeops: the maths --------------------------------------------------------------------------
def _system(H: int, M: int) -> DPLRSystem:
    """S4's HiPPO-LegS init in float32 (complex64 halves), as the layer builds it."""
    torch.manual_seed(0)
    layer = S4(d_model=H, d_state=2 * M, l_max=64, backend="cauchy")
    return layer._trained_system()


@pytest.mark.slow
@pytest.mark.requires("pykeops")
@pytest.mark.parametrize("L", [1023, 1024])  # odd length, and an even one with a Nyquist node
def test_keops_matches_cauchy(L: int) -> None:
    system = _system(3, 32)
    names = ("Lambda", "P", "B", "C", "dt")
    g = torch.randn(3, L)  # (H, L) upstream gradient
    outs, grads = [], []
    for fn in (kernel_cauchy, keops.kernel_cauchy_keops):  # first call compiles (tens of seconds)
        leaves = [getattr(system, n).detach().clone().requires_grad_() for n in names]
        outs.append(fn(DPLRSystem(*leaves), L))
        grads.append(torch.autograd.grad(outs[-1], leaves, g))
    ref, out = outs
    assert out.dtype == torch.float32
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5
    for name, a, b in zip(names, *grads):
        assert_close(f"d{name}", a, b, rtol=1e-4, atol=1e-4 * a.abs().max().item())
