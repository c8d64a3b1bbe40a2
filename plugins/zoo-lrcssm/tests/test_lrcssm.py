"""LrcSSM's own maths: the cell written out by hand, its diagonal Jacobian, Newton (deer) against the
sequential loop in outputs and gradients, the iteration bound, non-convergence, size and params."""

from __future__ import annotations

import logging
import math
import re
import warnings

import pytest
import torch
from pydantic import ValidationError

from zoo_core.build import build_model
from zoo_core.errors import CoreArgumentError, SpecError
from zoo_core.nn.blocks import count_params
from zoo_lrcssm.core import LrcSSM
from zoo_lrcssm.deer import NewtonConvergenceError, newton_fixed_point
from zoo_lrcssm.params import LrcSSMParams

F64 = torch.float64
NAMES_ASYM = ["weight_sensory_mu", "weight_sensory_sigma", "weight_sensory_w", "weight_sensory_h", "weight_mu",
              "weight_sigma", "weight_w", "weight_h", "weight_gleak", "weight_vleak", "weight_elastance_kernel",
              "weight_elastance_bias"]


def _layer(H=5, D=None, *, seed=0, scale=1.0, **kw) -> LrcSSM:
    """A float64 layer with every parameter perturbed away from init (scale × N(0, 1))."""
    torch.manual_seed(seed)
    layer = LrcSSM(d_model=H, d_state=D, dtype=F64, **kw)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(scale * torch.randn_like(p))
    return layer


def _twin(layer: LrcSSM, **kw) -> LrcSSM:
    """The same parameters under other settings (e.g. another backend)."""
    args = dict(d_model=layer.d_model, d_state=layer.d_state, elastance=layer.elastance, dt=layer.dt,
                tol=layer.tol, max_iter=layer.max_iter, on_nonconvergence=layer.on_nonconvergence)
    other = LrcSSM(**{**args, **kw}, dtype=F64)
    other.load_state_dict(layer.state_dict())
    return other


def _by_hand(layer: LrcSSM, u: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """models.md §8.1 transcribed, one sample and one step at a time: u (L, H), x0 (D,) -> (L, D)."""
    P = dict(layer.named_parameters())
    sig = torch.sigmoid
    x, out = x0, []
    for t in range(u.shape[0]):
        s_u = sig(P["weight_sensory_sigma"] * (u[t] - P["weight_sensory_mu"]))
        s_x = sig(P["weight_sigma"] * (x - P["weight_mu"]))
        f = P["weight_gleak"] + P["weight_sensory_w"] @ s_u + P["weight_w"] * s_x
        zz = P["weight_gleak"] + P["weight_sensory_h"] @ s_u + P["weight_h"] * s_x
        e = P["weight_elastance_kernel"] * x + P["weight_elastance_bias"]
        if layer.elastance == "symmetric":
            eps = layer.dt * (sig(e + P["weight_elastance_shift"]) - sig(e - P["weight_elastance_shift"]))
        else:
            eps = layer.dt * sig(e)
        x = x + eps * (-sig(f) * x + P["weight_vleak"] * torch.tanh(zz))
        out.append(x)
    return torch.stack(out)


# the cell ----------------------------------------------------------------------------------
@pytest.mark.parametrize("elastance", ["asymmetric", "symmetric"])
@pytest.mark.parametrize("backend", ["naive", "deer"])
def test_forward_is_the_cell_written_out(elastance, backend):
    """x_t from the formulas of §8.1, from a nonzero x_0, with dt ≠ 1; the output is the state."""
    layer = _layer(H=4, D=4, elastance=elastance, dt=0.7, backend=backend)
    u = torch.randn(2, 29, 4, dtype=F64)
    x0 = torch.randn(2, 4, dtype=F64)
    with torch.no_grad():
        y, state = layer.forward_with_state(u, {"x": x0})
        ref = torch.stack([_by_hand(layer, u[b], x0[b]) for b in range(2)])
    assert layer.out_proj is None
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state["x"], ref[:, -1], rtol=1e-12, atol=1e-12)


def test_state_is_mapped_out_when_d_state_differs():
    layer = _layer(H=5, D=3)
    u = torch.randn(1, 11, 5, dtype=F64)
    with torch.no_grad():
        states = _by_hand(layer, u[0], torch.zeros(3, dtype=F64))
        torch.testing.assert_close(layer(u)[0], layer.out_proj(states), rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # torch's own forward-AD import
@pytest.mark.parametrize("elastance,dt", [("asymmetric", 1.0), ("symmetric", 1.0), ("asymmetric", 0.3)])
def test_jacobian_closed_form_equals_jvp_and_is_diagonal(elastance, dt):
    """diag ∂F/∂x in closed form = torch.func.jvp with an all-ones tangent; the full Jacobian of one
    step has zero off-diagonals, so J·1 really is its diagonal."""
    layer = _layer(H=3, D=6, elastance=elastance, dt=dt, scale=0.5)
    x = torch.randn(4, 9, 6, dtype=F64)
    pf, pz = torch.randn(4, 9, 6, dtype=F64), torch.randn(4, 9, 6, dtype=F64)
    with torch.no_grad():
        F, J = layer.step_and_jacobian(x, pf, pz)
        F_jvp, J_jvp = torch.func.jvp(lambda v: layer.cell(v, pf, pz), (x,), (torch.ones_like(x),))
    torch.testing.assert_close(F, layer.cell(x, pf, pz), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(F_jvp, F, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(J, J_jvp, rtol=1e-12, atol=1e-12)
    full = torch.autograd.functional.jacobian(lambda v: layer.cell(v, pf[0, 0], pz[0, 0]), x[0, 0])  # (D, D)
    torch.testing.assert_close(full, torch.diag(J[0, 0]), rtol=1e-12, atol=1e-14)


# deer against the loop ---------------------------------------------------------------------
def _outputs_and_grads(layer: LrcSSM, u: torch.Tensor, x0: torch.Tensor) -> dict[str, torch.Tensor]:
    u, x0 = u.clone().requires_grad_(True), x0.clone().requires_grad_(True)
    y, state = layer.forward_with_state(u, {"x": x0})
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=y.dtype)
    loss = (y * g).sum() + state["x"].square().sum()
    names = [n for n, _ in layer.named_parameters()]
    grads = torch.autograd.grad(loss, [u, x0, *layer.parameters()])
    return {"output": y, "final state": state["x"], "grad u": grads[0], "grad x0": grads[1],
            **{f"grad {n}": gr for n, gr in zip(names, grads[2:], strict=True)}}


@pytest.mark.parametrize("elastance", ["asymmetric", "symmetric"])
@pytest.mark.parametrize("D", [None, 3])
@pytest.mark.parametrize("scan", ["naive", "scan"])
@pytest.mark.parametrize("window", [None, 8])
def test_deer_equals_the_loop_in_outputs_and_every_gradient(elastance, D, scan, window, monkeypatch):
    """float64, perturbed parameters, a nonzero initial state, L = 41 (in windows of 8 or one)."""
    monkeypatch.setattr(LrcSSM, "window_elems", None if window is None else window * 2 * (D or 5))
    monkeypatch.setattr(LrcSSM, "min_window", 1)
    ref_layer = _layer(H=5, D=D, elastance=elastance, scale=0.3, backend="naive")
    deer = _twin(ref_layer, backend={"scan": scan})
    assert deer.backend_choice.path == "deer" and deer.backend_choice.entries["scan"].name == scan
    u = torch.randn(2, 41, 5, dtype=F64)
    x0 = torch.randn(2, D or 5, dtype=F64)
    ref, out = _outputs_and_grads(ref_layer, u, x0), _outputs_and_grads(deer, u, x0)
    assert deer.last_solve.windows == (1 if window is None else math.ceil(41 / window))
    assert set(ref) == set(out) and len(ref) == 4 + len(list(ref_layer.parameters()))
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], rtol=1e-9, atol=1e-11, msg=key)


def test_deer_float32_is_close_to_the_loop_at_long_length():
    """float32 at the default tolerance 1e-4, L = 1500, default init: outputs and gradients."""
    torch.manual_seed(0)
    ref_layer = LrcSSM(d_model=8, d_state=8, backend="naive")
    deer = LrcSSM(d_model=8, d_state=8, backend="deer")
    deer.load_state_dict(ref_layer.state_dict())
    u = torch.randn(2, 1500, 8)
    ref, out = _outputs_and_grads(ref_layer, u, torch.zeros(2, 8)), _outputs_and_grads(deer, u, torch.zeros(2, 8))
    for key in ref:
        err = ((out[key] - ref[key]).norm() / ref[key].norm()).item()
        assert err < 1e-4, f"{key}: relative error {err:.2e}"
    assert deer.last_iterations is not None and deer.last_iterations < 1500


def test_hard_dynamics_converge_in_at_most_L_iterations():
    """Large weights (strongly nonlinear, symmetric elastance, dt = 2): Newton may need many sweeps,
    but each settles at least one step, so never more than L; the result is still the loop's."""
    L = 23
    for seed in range(4):
        ref_layer = _layer(H=3, D=4, seed=seed, scale=4.0, elastance="symmetric", dt=2.0, backend="naive")
        deer = _twin(ref_layer, backend="deer", max_iter=L)
        u = 3 * torch.randn(2, L, 3, dtype=F64)
        with torch.no_grad():
            ref, out = ref_layer(u), deer(u)
        assert 1 <= deer.last_iterations <= L
        assert deer.last_solve.converged
        torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-9)


def test_newton_needs_exactly_L_sweeps_when_nothing_settles_early():
    """tol = 0 can never be met by a change, so only the settled-prefix rule ends the iteration:
    exactly one step settles per sweep and the solver stops after L sweeps with the exact answer."""
    layer = _layer(H=3, D=4, scale=0.5, backend="naive")
    u = torch.randn(1, 12, 3, dtype=F64)
    with torch.no_grad():
        pf, pz = layer.drive(u)
        h0 = torch.zeros(1, 4, dtype=F64)
        from zoo_core.kernels.scan import scan_naive

        res = newton_fixed_point(layer.step_and_jacobian, (pf, pz), h0, scan=scan_naive, tol=0.0, max_iter=12)
        assert res.converged and res.iterations == 12
        torch.testing.assert_close(res.x[0], _by_hand(layer, u[0], h0[0]), rtol=1e-12, atol=1e-13)
        res = newton_fixed_point(layer.step_and_jacobian, (pf, pz), h0, scan=scan_naive, tol=0.0, max_iter=11)
        assert not res.converged and res.iterations == 11


def test_a_few_iterations_at_the_paper_size():
    """Default init, D = H = 64, L = 512, float32: a handful of Newton sweeps (the reference
    reports 5 at T = 60 in float64), reported on the layer and in a debug log line."""
    torch.manual_seed(0)
    layer = LrcSSM(d_model=64, d_state=64, backend="deer")
    logger = logging.getLogger("zoo_lrcssm")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with torch.no_grad():
            layer(torch.randn(2, 512, 64))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert 1 <= layer.last_iterations <= 10 * layer.last_solve.windows
    assert layer.last_solve.max_window_iterations <= 10
    assert any("Newton sweep" in r.getMessage() for r in records)


# non-convergence ---------------------------------------------------------------------------
def test_nonconvergence_warns_once_with_the_residual_and_falls_back_to_the_loop(caplog):
    ref_layer = _layer(H=3, D=4, scale=0.5, backend="naive")
    deer = _twin(ref_layer, backend="deer", max_iter=1)
    u = torch.randn(2, 30, 3, dtype=F64, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="zoo_lrcssm"):
        y = deer(u)
        deer(u)  # the fallback again: not announced twice
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1, said
    assert re.search(r"did not converge in max_iter=1 .*max\|x\^\(k\+1\) − x\^\(k\)\| = [0-9.e+-]+ > tol 1e-07.*sequential loop", said[0])
    assert not deer.last_solve.converged and deer.last_iterations == 1
    torch.testing.assert_close(y, ref_layer(u), rtol=1e-13, atol=1e-13)
    (g_deer,) = torch.autograd.grad(y.sum(), u)
    (g_ref,) = torch.autograd.grad(ref_layer(u).sum(), u)
    torch.testing.assert_close(g_deer, g_ref, rtol=1e-12, atol=1e-13)


def test_nonconvergence_can_be_an_error():
    deer = _layer(H=3, D=4, scale=0.5, backend="deer", max_iter=1, on_nonconvergence="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning on this path: the error says it all
        with pytest.raises(NewtonConvergenceError, match=r"residual|max\|x\^\(k\+1\)") as info:
            deer(torch.randn(1, 30, 3, dtype=F64))
    assert "raise max_iter" in str(info.value) and "backend 'naive'" in str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_converged_single_step_needs_no_fallback():
    """L = 1: the first sweep is exact (F of the initial state)."""
    deer = _layer(H=3, D=4, backend="deer", max_iter=1, on_nonconvergence="error")
    with torch.no_grad():
        deer(torch.randn(2, 1, 3, dtype=F64))
    assert deer.last_iterations == 1


# backends ----------------------------------------------------------------------------------
@pytest.mark.parametrize("setting,label", [
    ("naive", "sequential: no backend ops (the core computes it itself)"),
    ({}, "sequential: no backend ops (the core computes it itself)"),
    ("sequential", "sequential: no backend ops (the core computes it itself)"),
    ("auto", "deer: scan=scan"),
    ("deer", "deer: scan=scan"),
    ("scan", "deer: scan=scan"),
    ({"scan": "naive"}, "deer: scan=naive"),
])
def test_backend_settings(setting, label):
    assert LrcSSM(d_model=3, d_state=2, backend=setting).backend_choice.label() == label


def test_unknown_backend_is_refused():
    with pytest.raises(Exception, match="unknown backend 'fft'"):
        LrcSSM(d_model=3, backend="fft")
    with pytest.raises(Exception, match="chunked"):
        LrcSSM(d_model=3, backend={"scan": "chunked"})  # time-invariant systems only


# size and init -----------------------------------------------------------------------------
def test_parameter_count_matches_the_reference():
    """2m + 2Dm + 9D = 8,896 at m = D = 64 (models.md §8.1). The reference registers its elastance
    shift s_ε even when the default asymmetric elastance leaves it unused; here it exists only in
    the symmetric variant (an unused parameter would get no gradient), so the default has 8,832."""
    sym = LrcSSM(d_model=64, d_state=64, elastance="symmetric")
    assert count_params(sym) == 2 * 64 + 2 * 64 * 64 + 9 * 64 == 8_896
    asym = LrcSSM(d_model=64, d_state=64)
    assert count_params(asym) == 8_896 - 64
    assert [n for n, _ in asym.named_parameters()] == NAMES_ASYM
    assert [n for n, _ in sym.named_parameters()] == NAMES_ASYM + ["weight_elastance_shift"]
    shapes = {n: tuple(p.shape) for n, p in LrcSSM(d_model=7, d_state=3).named_parameters()}
    assert shapes["weight_sensory_mu"] == (7,) and shapes["weight_sensory_w"] == (3, 7)
    assert shapes["weight_vleak"] == (3,) and shapes["out_proj.weight"] == (7, 3)
    assert count_params(LrcSSM(d_model=7, d_state=3)) == 2 * 7 + 2 * 3 * 7 + 8 * 3 + (7 * 3 + 7)


def test_init_is_uniform_in_plus_minus_one_over_sqrt_d():
    """Every cell parameter ~ U[−1/√D, 1/√D] with D the state size (not the input width)."""
    torch.manual_seed(0)
    D = 400
    layer = LrcSSM(d_model=50, d_state=D, dtype=F64)
    lim = 1 / math.sqrt(D)
    for name, p in layer.named_parameters():
        if name.startswith("out_proj"):
            continue
        assert p.abs().max() <= lim, name
        if p.numel() >= 400:
            assert abs(p.std().item() / (lim / math.sqrt(3)) - 1) < 0.15, name
            assert abs(p.mean().item()) < 0.15 * lim, name
    big = layer.weight_sensory_w.flatten()
    assert abs(big.abs().mean().item() / (lim / 2) - 1) < 0.02  # |U[−a, a]| has mean a/2


def test_float32_and_float64_builds_agree():
    torch.manual_seed(6)
    a = LrcSSM(d_model=3, d_state=6, dtype=torch.float32)
    torch.manual_seed(6)
    b = LrcSSM(d_model=3, d_state=6, dtype=F64)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(p.to(F64), q, rtol=1e-6, atol=1e-7, msg=n)


# params ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad,field,rule", [
    ({"d_state": 0}, "d_state", "greater than or equal to 1"),
    ({"elastance": "sym"}, "elastance", "'asymmetric' or 'symmetric'"),
    ({"dt": 0.0}, "dt", "greater than 0"),
    ({"dt": float("inf")}, "dt", "finite number"),
    ({"tol": 0.0}, "tol", "greater than 0"),
    ({"tol": 1.5}, "tol", "less than 1"),
    ({"max_iter": 0}, "max_iter", "greater than or equal to 1"),
    ({"on_nonconvergence": "ignore"}, "on_nonconvergence", "'fallback' or 'error'"),
    ({"r_min": 0.5}, "r_min", "Extra inputs are not permitted"),
])
def test_bad_params_are_rejected_naming_the_field(bad, field, rule):
    with pytest.raises(ValidationError) as info:
        LrcSSMParams.model_validate({"d_model": 4, **bad})
    assert field in str(info.value) and rule in str(info.value)


@pytest.mark.parametrize("kw,match", [
    ({"elastance": "sym"}, "elastance = 'sym': Input should be 'asymmetric' or 'symmetric'"),
    ({"on_nonconvergence": "ignore"}, "on_nonconvergence = 'ignore': Input should be 'fallback' or 'error'"),
    ({"dt": -1.0}, "dt = -1.0: Input should be greater than 0"),
    ({"tol": 2.0}, "tol = 2.0: Input should be less than 1"),
    ({"max_iter": 0}, "max_iter = 0: Input should be greater than or equal to 1"),
])
def test_direct_construction_refuses_the_same(kw, match):
    """The params model's rules, applied by CoreBase to a direct call: the core and the argument named."""
    with pytest.raises(CoreArgumentError, match="^LrcSSM: invalid constructor argument: " + match):
        LrcSSM(d_model=3, **kw)


def test_defaults():
    p = LrcSSMParams.model_validate({"d_model": 4})
    assert (p.d_state, p.elastance, p.dt, p.tol, p.max_iter, p.on_nonconvergence, p.backend) == (
        None, "asymmetric", 1.0, None, 100, "fallback", "auto")


def _spec(core: dict) -> dict:
    return {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 8, "depth": 2, "core": {"kind": "lrcssm", **core}}}


def test_spec_builds_and_backends_agree():
    torch.manual_seed(0)
    x = torch.randn(2, 33, 2)
    outs = []
    for backend in ("naive", "auto"):
        model = build_model(_spec({"preset": "tiny", "backend": backend}), seed=0).eval()
        with torch.no_grad():
            outs.append(model(x))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)


def test_bad_spec_error_names_the_key_path():
    with pytest.raises(SpecError, match="elastance"):
        build_model(_spec({"preset": "tiny", "elastance": "both"}))


def test_a_spec_can_name_the_newton_path():
    """`backend: deer` in a spec names the Newton path (its scan on auto), `naive` the loop."""
    from zoo_core.build import build_model

    def spec(backend):
        return {"schema_version": 1, "task": {"kind": "classification", "classes": 2}, "input": {"channels": 3},
                "model": {"d_model": 8, "depth": 1, "core": {"kind": "lrcssm", "preset": "tiny", "backend": backend}}}

    assert build_model(spec("deer")).cores()[0].backend_choice.path == "deer"
    assert build_model(spec("naive")).cores()[0].backend_choice.path == "sequential"


# export -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("elastance", ["asymmetric", "symmetric"])
def test_exported_forward_takes_any_length_through_the_opaque_loop(elastance):
    """Exported, the exact loop is one op (zoo::lrcssm_sequential) with a symbolic length: the program
    equals the eager core at other lengths, from a given state, and refuses a backward."""
    from torch.export import Dim

    layer = _layer(H=4, D=4, elastance=elastance, dt=0.7, backend="deer").eval()

    class WithState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.core = layer

        def forward(self, u, x0):
            y, state = self.core.forward_with_state(u, {"x": x0})
            return y, state["x"]

    u, x0 = torch.randn(2, 9, 4, dtype=F64), torch.randn(2, 4, dtype=F64)
    batch, length = Dim("batch", min=1, max=64), Dim("length", min=2, max=4096)
    with torch.no_grad():
        program = torch.export.export(WithState(), (u, x0), dynamic_shapes=({0: batch, 1: length}, {0: batch}))
    assert any("lrcssm_sequential" in str(n.target) for n in program.graph.nodes)
    run = program.module()
    for B, L in ((2, 9), (3, 2), (1, 40)):
        u, x0 = torch.randn(B, L, 4, dtype=F64), torch.randn(B, 4, dtype=F64)
        with torch.no_grad():
            y, last = run(u, x0)
            y_ref, state = layer.forward_with_state(u, {"x": x0})
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(last, state["x"], rtol=1e-10, atol=1e-12)
    u.requires_grad_(True)
    with pytest.raises(RuntimeError, match="export-only form"):
        run(u, x0)[0].sum().backward()


def test_the_opaque_loop_restarts_packed_documents_as_the_traced_one():
    from zoo_lrcssm.export_op import lrcssm_sequential_op

    layer = _layer(H=4, D=4, elastance="symmetric", dt=0.7, backend="naive")
    pf, pz = (torch.randn(2, 11, 4, dtype=F64) for _ in range(2))
    h0 = torch.randn(2, 4, dtype=F64)
    keep = torch.ones(2, 11, 1, dtype=F64)
    keep[0, 4] = keep[1, 7] = 0  # a document starts there
    with torch.no_grad():
        ref = layer._solve_sequential(pf, pz, h0, keep)
        got = lrcssm_sequential_op(pf, pz, h0, keep, *layer._cell_params())
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=0)
