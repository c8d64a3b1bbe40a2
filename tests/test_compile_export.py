"""``torch.compile(fullgraph=True)`` and ``torch.export`` for every registered core, forward and step.

Each core is built from its ``tiny`` preset at d_model 6 in float64 with its ``auto`` backends on CPU,
and every compiled or exported program is compared with the same core run eagerly:

- compile (``backend="aot_eager"``: the full dynamo + AOTAutograd pipeline without code generation)
  of the forward, outputs and every gradient (input and parameters), and of ``step`` on a non-zero
  state (output and new state); ``fullgraph=True`` makes any graph break a failure;
- ``torch.export`` of ``step`` through ``zoo_core.export.StepModule`` (flat state tensors) and of the
  forward, both with a dynamic batch, run at the example batch and at another one;
- the forward with a dynamic length too, where the core's ops allow; where they do not, the test
  checks that export fails and xfails naming the op and why (a fix makes the test fail until the
  table below is updated, so the list stays true);
- whole models (``specs/s4d-tiny.yaml``, the token LM ``benchmarks/tasks/specs/lm-2layer.yaml`` around
  a few cores), forward and step;
- Inductor (code generation) for a few cores, marked ``slow``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import Tensor

from zoo_core.build import build_model
from zoo_core.export import StepModule, export_forward, export_step, state_names
from zoo_core.plugins import get_registry
from zoo_core.testing.checks import case_from_registry
from zoo_core.testing.helpers import cores_with

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]
CORES = sorted(get_registry().cores)
STREAMING = cores_with("step")
D = 6  # d_model: even, so attention's RoPE (head_dim = d_model / n_heads) is allowed
TOL = {"rtol": 1e-9, "atol": 1e-11}

# Cores whose compile and export cost several seconds each (chunked ops traced chunk by chunk, a
# sequential loop unrolled over L): run in the slow tier so this module stays well under 90 s.
HEAVY = {"gdn", "mamba2", "mamba3", "lrcssm", "rglru"}

# The diagonal / 2x2-block scan cores: their length is dynamic when auto picks the C++ scan custom op
# (cpu-scan: one opaque node with a fake implementation); on the Python scans (zoo_core.kernels.scan:
# a loop over time, or over chunks) L is unrolled into the graph, so export specialises it.
LOOP_SCAN_CORES = {"lru", "s5", "s5-bidirectional", "linoss", "rglru"}
OPAQUE_SCANS = {"cpu-scan"}
LENGTH_STATIC: dict[str, str] = {}


def _params(c: str) -> list[Any]:
    return [pytest.param(c, marks=pytest.mark.slow) if c in HEAVY else c]


def _each(cores: list[str]) -> list[Any]:
    return [p for c in cores for p in _params(c)]


def _core(name: str) -> Any:
    torch._dynamo.reset()  # a fresh cache per case: no recompile limit reached across cores
    return case_from_registry(name, d_model=D).make(dtype=F64)


def _x(B: int, L: int, seed: int = 1) -> Tensor:
    return torch.randn(B, L, D, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _close(name: str, ref: Tensor, out: Tensor) -> None:
    torch.testing.assert_close(out, ref, **TOL, msg=lambda m: f"{name}: {m}")


def _states_close(name: str, ref: dict[str, Tensor], out: dict[str, Tensor]) -> None:
    assert set(out) == set(ref), f"{name}: state keys {sorted(out)} != {sorted(ref)}"
    for k in ref:
        _close(f"{name}[{k!r}]", ref[k], out[k])


def _grads(core: Any, fn: Any, x: Tensor) -> tuple[Tensor, list[Tensor | None]]:
    x = x.clone().requires_grad_(True)
    y = fn(x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype)
    params = [p for p in core.parameters() if p.requires_grad]
    grads = torch.autograd.grad((y * dy).sum(), [x, *params], allow_unused=True)
    return y.detach(), list(grads)


def _prefix_state(core: Any, B: int) -> dict[str, Tensor]:
    """A non-zero state: the core's state after a few steps of input (not just init_state's zeros)."""
    with torch.no_grad():
        _, state = core.forward_with_state(_x(B, 4, seed=3))
    return dict(state)


# compile ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", _each(CORES))
def test_compile_forward_and_backward_match_eager(name: str) -> None:
    _check_compile(_core(name))


def _check_compile(core: Any) -> None:
    compiled = torch.compile(core, fullgraph=True, backend="aot_eager")  # a graph break raises
    x = _x(2, 9)
    y_ref, g_ref = _grads(core, core, x)
    y, g = _grads(core, compiled, x)
    _close("forward", y_ref, y)
    names = ["input", *(n for n, p in core.named_parameters() if p.requires_grad)]
    for n, ref, out in zip(names, g_ref, g, strict=True):
        assert (ref is None) == (out is None), f"grad {n}: eager {ref is not None}, compiled {out is not None}"
        if ref is not None and out is not None:
            _close(f"grad {n}", ref, out)


@pytest.mark.parametrize("name", _each(STREAMING))
def test_compile_step_matches_eager(name: str) -> None:
    core = _core(name).eval()
    state, x_t = _prefix_state(core, 2), _x(2, 1, seed=5)[:, 0]
    with torch.no_grad():
        y_ref, s_ref = core.step(x_t, state)
        y, s = torch.compile(core.step, fullgraph=True, backend="aot_eager")(x_t, state)
    _close("step output", y_ref, y)
    _states_close("step state", dict(s_ref), dict(s))


# export -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", _each(STREAMING))
def test_export_step_with_dynamic_batch(name: str) -> None:
    core = _core(name).eval()
    state, x_t = _prefix_state(core, 2), _x(2, 1, seed=5)[:, 0]
    with torch.no_grad():
        program, wrapper = export_step(core, x_t, state)
    assert wrapper.names == state_names(state) == tuple(sorted(state))
    run = program.module()
    for B in (2, 3):  # the example batch and another: the batch is a Dim
        state_b, x_b = _prefix_state(core, B), _x(B, 1, seed=B)[:, 0]
        with torch.no_grad():
            y_ref, s_ref = core.step(x_b, state_b)
            y, *flat = run(x_b, *wrapper.flatten(state_b))
        _close(f"exported step output (B={B})", y_ref, y)
        _states_close(f"exported step state (B={B})", dict(s_ref), dict(zip(wrapper.names, flat, strict=True)))


@pytest.mark.parametrize("name", _each(CORES))
def test_export_forward_with_dynamic_batch(name: str) -> None:
    _check_export_batch(_core(name).eval())


def _check_export_batch(core: Any) -> None:
    with torch.no_grad():
        run = export_forward(core, _x(2, 9)).module()
        for B in (2, 3):
            x = _x(B, 9, seed=B)
            _close(f"exported forward (B={B})", core(x), run(x))


# The slower paths auto takes where a fused C++ kernel cannot be built (no compiler, no ninja): a user
# there still compiles and exports. (Found: the chunked selective scan's transposed gradients broke
# the compiled backward.)
FALLBACKS = [("mamba", "selective-chunked"), ("lru", "naive"), ("s5", "naive"), ("linoss", "naive")]


@pytest.mark.parametrize(("name", "backend"), FALLBACKS)
def test_fallback_paths_compile_and_export(name: str, backend: str) -> None:
    torch._dynamo.reset()
    core = case_from_registry(name, d_model=D).make(dtype=F64, backend=backend)
    assert backend in core.backend_choice.label()
    _check_compile(core)
    _check_export_batch(core.eval())


def _length_blocker(name: str, core: Any) -> str | None:
    """Why the core's forward cannot take a dynamic length with the backends it resolved, or None."""
    if name in LENGTH_STATIC:
        return LENGTH_STATIC[name]
    choice = getattr(core, "backend_choice", None)
    scan = None if choice is None else choice.entries.get("scan")
    if name in LOOP_SCAN_CORES and (scan is None or scan.name not in OPAQUE_SCANS):
        return (f"its scan backend here, {getattr(scan, 'name', None)!r}, is a Python loop over time or chunks "
                f"(zoo_core.kernels.scan): L is unrolled into the graph, so export specialises it (cpu-scan, the "
                f"C++ custom op, is dynamic in L; auto picks it where it builds and serves the problem, unless the core "
                f"pins another on CPU, as RG-LRU does: backend {{scan: cpu-scan}} takes it)")
    return None


@pytest.mark.parametrize("name", _each(CORES))
def test_export_forward_with_dynamic_length(name: str) -> None:
    """Passes where the ops allow a dynamic length; elsewhere export must fail, and the test is an xfail
    naming why (were export to succeed there, the test fails: the table above is out of date)."""
    core = _core(name).eval()
    blocker = _length_blocker(name, core)
    with torch.no_grad():
        if blocker is not None:
            with pytest.raises(Exception, match="specializ|Constraints violated|guard"):
                export_forward(core, _x(2, 9), dynamic_length=True)
            pytest.xfail(blocker)
        run = export_forward(core, _x(2, 9), dynamic_length=True).module()
        bound = getattr(core, "max_export_length", None)  # S4: up to l_max, that length included
        for B, L in ((2, 9), (3, 20), *(((2, bound),) if bound else ())):
            x = _x(B, L, seed=L)
            _close(f"exported forward (B={B}, L={L})", core(x), run(x))


def test_rglru_on_the_cpp_scan_exports_a_dynamic_length() -> None:
    """RG-LRU's auto pins the parallel scan on CPU (a Python loop over chunks: a fixed exported length);
    on the C++ scan its forward takes any length (its reset mask is built without an (L - 1)-long piece)."""
    from zoo_core.kernels.scan_cpu import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"the C++ scan is not built here: {unavailable_reason()}")
    torch._dynamo.reset()
    core = case_from_registry("rglru", d_model=D).make(dtype=F64, backend={"scan": "cpu-scan"}).eval()
    with torch.no_grad():
        run = export_forward(core, _x(2, 9), dynamic_length=True).module()
        for B, L in ((2, 9), (3, 2), (3, 20)):
            x = _x(B, L, seed=L)
            _close(f"exported forward (B={B}, L={L})", core(x), run(x))


def test_length_reasons_name_registered_cores() -> None:
    """The xfail table names cores that exist (a renamed core would otherwise pass silently)."""
    assert set(LENGTH_STATIC) <= set(CORES)


# whole models -------------------------------------------------------------------------------------
def _spec(path: str, core: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((ROOT / path).read_text())
    spec.pop("training", None)
    if core is not None:
        spec["model"]["core"] = core
        spec["model"]["d_model"] = 16
    return spec


MODELS = {
    "s4d-tiny": ("specs/s4d-tiny.yaml", None),
    "lm-2layer/lru": ("benchmarks/tasks/specs/lm-2layer.yaml", {"kind": "lru", "preset": "tiny"}),
    "lm-2layer/mamba": ("benchmarks/tasks/specs/lm-2layer.yaml", {"kind": "mamba", "preset": "tiny"}),
}


def _model_input(model: Any, B: int, L: int) -> Tensor:
    g = torch.Generator().manual_seed(B * 100 + L)
    spec_in = model.spec["input"]
    if "vocab_size" in spec_in:
        return torch.randint(0, int(spec_in["vocab_size"]), (B, L), generator=g)
    return torch.randn(B, L, int(spec_in["channels"]), generator=g, dtype=F64)


@pytest.mark.parametrize("which", sorted(MODELS))
def test_whole_model_compiles_and_exports(which: str) -> None:
    torch._dynamo.reset()
    path, core = MODELS[which]
    model = build_model(_spec(path, core), seed=0).double().eval()
    x = _model_input(model, 2, 7)
    with torch.no_grad():
        _close("compiled model forward", model(x), torch.compile(model, fullgraph=True, backend="aot_eager")(x))
        _close("exported model forward", model(x), export_forward(model, x).module()(x))
        _, state = model.forward_with_state(x[:, :4])
        program, wrapper = export_step(model, x[:, 4], state)
        assert isinstance(wrapper, StepModule) and wrapper.names == tuple(sorted(state.flatten()))
        y_ref, s_ref = model.step(x[:, 4], state)
        y, *flat = program.module()(x[:, 4], *wrapper.flatten(state))
    _close("exported model step", y_ref, y)
    _states_close("exported model step state", s_ref.flatten(), dict(zip(wrapper.names, flat, strict=True)))


# the ops made custom ops for this ----------------------------------------------------------------
def test_cauchy_khat_custom_op_passes_opcheck() -> None:
    """S4's Cauchy kernel op: schema, fake (meta) shapes, autograd registration, under dynamo/AOT too."""
    from zoo_core.kernels import dplr

    g = torch.Generator().manual_seed(0)
    H, M, L = 3, 4, 10
    v = torch.randn(H, 4, M, generator=g, dtype=torch.complex128, requires_grad=True)
    dlam = torch.complex(-torch.rand(H, M, generator=g, dtype=F64), torch.randn(H, M, generator=g, dtype=F64)).requires_grad_()
    dt = torch.rand(H, generator=g, dtype=F64).add(0.1).requires_grad_()
    one_m, one_p = dplr._nodes(L, torch.complex128, v.device)
    torch.library.opcheck(dplr.cauchy_khat, (v, dlam, dt, one_m, one_p))
    # the compiled op's first call (where dynamo runs it with the Conjugate key excluded) equals eager
    ref = dplr._khat_chunked(v, dlam, dt, one_m, one_p)
    _close("compiled cauchy_khat", ref, torch.compile(dplr.cauchy_khat, fullgraph=True, backend="aot_eager")(v, dlam, dt, one_m, one_p))


# inductor -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["lru", "mamba", "attention"])
def test_inductor_forward_and_step_match_eager(name: str) -> None:
    """Code generation (Inductor) for a few cores; real-valued cores only: Inductor cannot code-generate
    complex arithmetic (S4D's, S5's complex kernels fall back op by op), which aot_eager covers above."""
    core = _core(name).eval()
    x = _x(2, 9)
    with torch.no_grad():
        _close("inductor forward", core(x), torch.compile(core, fullgraph=True)(x))
        state, x_t = _prefix_state(core, 2), x[:, 0]
        y_ref, s_ref = core.step(x_t, state)
        y, s = torch.compile(core.step, fullgraph=True)(x_t, state)
    _close("inductor step", y_ref, y)
    _states_close("inductor step state", dict(s_ref), dict(s))


def test_a_bounded_length_stops_at_the_cores_bound() -> None:
    """S4's forward exports for lengths up to its l_max (its kernel's length): the Dim says so, a longer
    input is refused by the program rather than run on a kernel too short, and a model reports the bound."""
    from zoo_core.export import length_bound

    core = _core("s4").eval()
    assert length_bound(core) == core.l_max
    with torch.no_grad():
        run = export_forward(core, _x(2, 9), dynamic_length=True).module()
        with pytest.raises(Exception, match="Guard failed"):  # the program's own check, not an index error inside
            run(_x(2, core.l_max + 1))
    model = build_model(_spec("specs/s4d-tiny.yaml", {"kind": "s4", "preset": "tiny"}))
    assert length_bound(model) == next(iter(model.cores())).l_max
    assert length_bound(_core("s4d")) is None
