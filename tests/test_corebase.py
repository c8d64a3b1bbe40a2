"""The core contract made explicit by ``CoreBase``: arguments validated by the params model (one
message style), the backend resolved and bound at build time (no path test in ``forward``, the
structure bound into the op) and again on a move to another device type, discretizers looked up in
one call, capabilities declared once."""

from __future__ import annotations

import functools

import pytest
import torch
from pydantic import ValidationError

from zoo_core.corebase import CoreBase, runs_path
from zoo_core.errors import BackendUnavailableError, CoreArgumentError
from zoo_core.params import CoreParams, DtRange
from zoo_core.plugin_registry import Problem
from zoo_core.plugins import get_registry
from zoo_s4d.core import S4D


def test_direct_constructor_arguments_go_through_the_params_model():
    """A core built without the spec system gets the spec's rules, naming the core and the argument."""
    with pytest.raises(CoreArgumentError, match=r"^S4D: invalid constructor argument: d_state must be even") as info:
        S4D(d_model=4, d_state=7)
    assert info.value.exit_code == 2 and isinstance(info.value, ValueError)
    with pytest.raises(CoreArgumentError, match=r"^S4D: .*dt_min = 0\.0: Input should be greater than 0"):
        S4D(d_model=4, dt_min=0.0)
    with pytest.raises(CoreArgumentError, match=r"init = 'legz'.*'legs', 'lin', 'inv' or 'real'"):
        S4D(d_model=4, init="legz")


@pytest.mark.parametrize("name", sorted(n for n, e in get_registry().cores.items() if issubclass(e.params, DtRange)))
def test_the_dt_range_rule_is_written_once(name):
    """Every family with a Δ range shares DtRange's validator and message (spec and constructor)."""
    entry = get_registry().core(name)
    with pytest.raises(ValidationError, match="must not exceed dt_max"):
        entry.params.model_validate({**entry.preset("tiny"), "d_model": 4, "dt_min": 0.5, "dt_max": 0.2})
    with pytest.raises(CoreArgumentError, match=f"^{entry.load().__name__}: .*must not exceed dt_max"):
        entry.load()(**{**entry.preset("tiny"), "d_model": 4, "dt_min": 0.5, "dt_max": 0.2})


def test_the_chosen_path_is_bound_once_and_forward_never_reads_it():
    conv, rec = S4D(d_model=3, d_state=4), S4D(d_model=3, d_state=4, backend="naive")
    assert conv.run_path.__func__ is S4D._convolve and rec.run_path.__func__ is S4D._recurrent
    x = torch.randn(2, 5, 3)
    ref = rec(x)

    class Poisoned:
        def __getattr__(self, name):
            raise AssertionError(f"forward read backend_choice.{name}: the path must be chosen at build time")

    rec.backend_choice = Poisoned()
    torch.testing.assert_close(rec(x), ref)


def test_the_structure_is_bound_when_the_op_is_resolved():
    from zoo_core.kernels.scan import scan_naive

    rec = S4D(d_model=3, d_state=4, backend="naive")
    assert isinstance(rec.ops.scan, functools.partial) and rec.ops.scan.func is scan_naive
    assert rec.ops.scan.keywords == {"structure": "diag"}
    with pytest.raises(AttributeError, match="path 'recurrent' runs no 'kernel' op"):
        rec.ops.kernel  # noqa: B018


def test_two_paths_without_a_marked_method_are_refused_at_class_definition():
    with pytest.raises(TypeError, match=r"no method marked @runs_path for \['b'\]"):
        class TwoPaths(CoreBase):  # noqa: F841
            paths = {"a": ("scan",), "b": ("scan",)}

            @runs_path("a")
            def _a(self) -> None: ...


def test_the_discretizer_lookup_is_one_call_that_names_both_sides():
    core = S4D(d_model=2, d_state=4, discretizer="bilinear")
    assert core._discretize.keywords == {"structure": "diag"}
    with pytest.raises(CoreArgumentError, match=r"discretizer 'linoss-im' handles block2x2 systems, not the 'diag'"):
        S4D(d_model=2, d_state=4, discretizer="linoss-im")


def test_device_type_goes_into_the_problem_and_pins_apply_there():
    class Pinned(CoreBase):
        paths = {"recurrent": ("scan",)}
        problem = Problem(structure="diag", lti=True)
        auto_backends = {"cpu": {"scan": "scan"}}
        reference = {"scan": "naive"}  # what backend="naive" means (without it, naive is the unpinned auto choice)

        def __init__(self, d_model: int, backend: str = "auto", *, device=None, dtype=None) -> None:
            super().__init__()

    assert Pinned(2).backend_choice.entries["scan"].name == "scan"  # pinned on cpu over the C++ scan's priority
    assert Pinned(2, backend="naive").backend_choice.entries["scan"].name == "naive"


@pytest.mark.parametrize("name", sorted(get_registry().cores))
def test_capabilities_are_declared_once_on_the_params_model(name):
    entry = get_registry().core(name)
    assert entry.capabilities == entry.params.capabilities == entry.load().capabilities
    assert "step" not in entry.capabilities or "causal" in entry.capabilities


def test_a_core_without_a_params_model_is_not_validated():
    class Loose(CoreBase):
        def __init__(self, d_model: int, anything: object = None, *, device=None, dtype=None) -> None:
            super().__init__()

    assert Loose(3, anything=object()).hparams is None


def test_validated_arguments_are_kept_on_the_core():
    core = S4D(d_model=3, d_state=6)
    assert isinstance(core.hparams, CoreParams) and core.hparams.d_state == 6 and core.hparams.backend == "auto"


def _scan_backends(model: torch.nn.Module) -> dict[str, str]:
    return {n: m.backend_choice.label() for n, m in model.named_modules() if isinstance(m, CoreBase)}


@pytest.mark.parametrize("name", ["s5", "lru", "linoss", "mamba"])
def test_moving_a_core_to_another_device_binds_that_devices_backend(name):
    """Built on CPU, ``auto`` binds a CPU-only op (the C++ scans); ``model.to(device)`` must bind what
    runs there. It did not: every S5/LRU/LinOSS/Mamba model trained on a GPU (built on CPU, then moved,
    as ``zoo train`` and most users do) failed with "Could not run 'zoo::linear_scan_fwd' with arguments
    from the 'CUDA' backend". Here the other device is meta (a GPU's path is the same code)."""
    from zoo_core.build import build_model
    from zoo_core.spec import load_spec

    preset = {"mamba": {"d_state": 4, "expand": 1}}.get(name, {"d_state": 16})
    spec = load_spec({"schema_version": 1, "name": "moved", "task": {"kind": "classification", "classes": 2},
                      "input": {"channels": 3}, "model": {"d_model": 8, "depth": 2, "core": {"kind": name, **preset}}})
    model = build_model(spec, seed=0)
    on_cpu = _scan_backends(model)  # with the C++ extension built: the CPU-only ops (cpu-scan, selective-cpu)
    expected = {n: m.resolve_backend("auto", device="meta").label() for n, m in model.named_modules() if isinstance(m, CoreBase)}
    assert len(on_cpu) == 2 and not any("cpu" in label for label in expected.values()), expected
    model.to("meta")
    assert _scan_backends(model) == expected
    model.to_empty(device="cpu")  # and back: the CPU's choice again
    assert _scan_backends(model) == on_cpu


def test_a_named_backend_the_new_device_cannot_run_is_refused_with_the_reason():
    from zoo_s5.core import S5

    core = S5(8, d_state=16, backend={"scan": "cpu-scan"})
    with pytest.raises(BackendUnavailableError, match=r"runs on CPU tensors only.*built on cpu with backend=.*moved to meta: "
                                                      r"build it with backend='auto'"):
        core.to("meta")
    core = S5(8, d_state=16, backend="naive")  # runs everywhere: kept
    core.to("meta")
    assert core.backend_choice.entries["scan"].name == "naive"
    core.double()  # a dtype change on the same device rebinds nothing
    assert core.backend_choice.entries["scan"].name == "naive"
