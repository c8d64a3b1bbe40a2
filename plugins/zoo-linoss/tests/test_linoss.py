"""LinOSS's own maths: the two schemes against their definitions, the Jordan case, the IMEX rule,
the parameter count, Δ rescaling and the errors for bad input (models.md §7, §12.2, §13.2, §14.3)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from zoo_core.errors import UnknownNameError
from zoo_core.plugins import get_registry
from zoo_linoss.core import LinOSS
from zoo_linoss.discretize import UnstableDiscretizationError, linoss_im, linoss_imex
from zoo_linoss.params import LinOSSParams

F64 = torch.float64
# (A, Δ) pairs: A = 0 (Jordan block), small and large stiffness, IMEX's boundary Δ²A = 4.
GRID = [(0.0, 0.5), (0.0, 1.0), (0.3, 0.6), (1.0, 1.0), (2.5, 0.9), (10.0, 0.2), (16.0, 0.5), (4.0, 1.0)]


def _grid() -> tuple[torch.Tensor, torch.Tensor]:
    A, dt = zip(*GRID, strict=True)
    return torch.tensor(A, dtype=F64), torch.tensor(dt, dtype=F64)  # (P,), (P,)


def _B(P: int, H: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(P, H, dtype=torch.complex128, generator=g)  # (P, H)


# the two schemes against their definitions ------------------------------------------------
def test_im_is_a_direct_solve_of_the_implicit_system():
    """z_n = z + Δ(−A y_n + v), y_n = y + Δ z_n  ⇔  [[1, ΔA], [−Δ, 1]] [z_n; y_n] = [z + Δv; y]."""
    A, dt = _grid()
    B = _B(len(GRID))
    d = linoss_im(A, B, dt)
    one, zero = torch.ones_like(A), torch.zeros_like(A)
    K = torch.stack([torch.stack([one, dt * A], -1), torch.stack([-dt, one], -1)], -2)  # (P, 2, 2)
    M = torch.linalg.solve(K, torch.eye(2, dtype=F64).expand_as(K))  # (P, 2, 2)
    f = torch.linalg.solve(K, torch.stack([dt, zero], -1))  # (P, 2): response to v = 1
    torch.testing.assert_close(d.a, M, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(d.b, B[..., None] * f[:, None, :].to(B.dtype), rtol=1e-14, atol=1e-14)
    assert d.log_a is None and d.a.dtype == F64 and d.b.shape == (len(GRID), 3, 2)


def test_imex_is_one_symplectic_euler_step():
    """z_n = z + Δ(−A y + v), then y_n = y + Δ z_n, applied to the basis states and to v = 1."""
    A, dt = _grid()
    d = linoss_imex(A, _B(len(GRID)), dt)

    def euler(z, y, v):  # one step, per oscillator
        z = z + dt * (-A * y + v)
        return torch.stack([z, y + dt * z], -1)  # (P, 2)

    one, zero = torch.ones_like(A), torch.zeros_like(A)
    M = torch.stack([euler(one, zero, zero), euler(zero, one, zero)], -1)  # (P, 2, 2), columns
    torch.testing.assert_close(d.a, M, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(d.b, _B(len(GRID))[..., None] * euler(zero, zero, one)[:, None, :].to(torch.complex128))


@pytest.mark.parametrize("A,dt", GRID)
def test_closed_forms_of_section_7_3(A, dt):
    """The §7.3 formulas written out entry by entry, at several (A, Δ)."""
    S = 1 / (1 + dt * dt * A)
    im = linoss_im(torch.tensor([A], dtype=F64), torch.ones(1, 1, dtype=F64), dt)
    imex = linoss_imex(torch.tensor([A], dtype=F64), torch.ones(1, 1, dtype=F64), dt)
    torch.testing.assert_close(im.a[0], torch.tensor([[S, -dt * A * S], [dt * S, S]], dtype=F64))
    torch.testing.assert_close(im.b[0, 0], torch.tensor([dt * S, dt * dt * S], dtype=F64))
    torch.testing.assert_close(imex.a[0], torch.tensor([[1, -dt * A], [dt, 1 - dt * dt * A]], dtype=F64))
    torch.testing.assert_close(imex.b[0, 0], torch.tensor([dt, dt * dt], dtype=F64))


def test_closed_forms_by_hand():
    """A = 1, Δ = 1: S = 1/2, so M_IM = [[.5, −.5], [.5, .5]] and M_IMEX = [[1, −1], [1, 0]]."""
    one = torch.ones(1, dtype=F64)
    im, imex = linoss_im(one, one[:, None], 1.0), linoss_imex(one, one[:, None], 1.0)
    torch.testing.assert_close(im.a[0], torch.tensor([[0.5, -0.5], [0.5, 0.5]], dtype=F64))
    torch.testing.assert_close(im.b[0, 0], torch.tensor([0.5, 0.5], dtype=F64))
    torch.testing.assert_close(imex.a[0], torch.tensor([[1.0, -1.0], [1.0, 0.0]], dtype=F64))
    torch.testing.assert_close(imex.b[0, 0], torch.tensor([1.0, 1.0], dtype=F64))


def test_im_eigenvalue_moduli():
    """|eig M_IM| = (1 + Δ²A)^(−1/2) for both eigenvalues (A = 0 included: a double eigenvalue 1)."""
    A, dt = _grid()
    moduli = torch.linalg.eigvals(linoss_im(A, _B(len(GRID)), dt).a).abs()  # (P, 2)
    expect = (1 + dt * dt * A) ** -0.5
    torch.testing.assert_close(moduli, expect[:, None].expand(-1, 2), rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("dt2A_target", [0.0, 0.5, 2.0, 3.99, 4.0])
def test_imex_eigenvalues_on_the_unit_circle_while_dt2A_le_4(dt2A_target):
    dt = torch.tensor([0.25, 0.5, 1.0, 1.5], dtype=F64)
    A = dt2A_target / dt**2  # (P,)
    M = linoss_imex(A, _B(4), dt).a
    torch.testing.assert_close(torch.linalg.det(M), torch.ones(4, dtype=F64))
    # a defective double eigenvalue (A = 0, or Δ²A = 4) is found to about √eps only
    torch.testing.assert_close(torch.linalg.eigvals(M).abs(), torch.ones(4, 2, dtype=F64), rtol=0, atol=1e-7)


def test_imex_explodes_beyond_dt2A_4():
    """Δ²A = 8.1 gives eigenvalue moduli {0.17, 5.93} (models.md §7.3)."""
    M = linoss_imex(torch.tensor([8.1], dtype=F64), torch.ones(1, 1, dtype=F64), 1.0).a
    moduli = torch.linalg.eigvals(M).abs().sort().values[0]
    torch.testing.assert_close(moduli, torch.tensor([0.1686, 5.9314], dtype=F64), atol=1e-4, rtol=0)


# the layer against an explicit loop (Jordan blocks included) ------------------------------
def _explicit_loop(layer: LinOSS, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """§7.3 in complex arithmetic, one step at a time, written from the formulas (no scan)."""
    A, dt = torch.relu(layer.A_diag), torch.sigmoid(layer.steps) * layer.dt_scale  # (P,)
    B, C = torch.view_as_complex(layer.B), torch.view_as_complex(layer.C)  # (P, H), (H, P)
    if layer.discretizer == "linoss-im":
        S = 1 / (1 + dt**2 * A)
        m = (S, -dt * A * S, dt * S, S)
        fz, fy = dt * S, dt**2 * S
    else:
        m = (torch.ones_like(A), -dt * A, dt, 1 - dt**2 * A)
        fz, fy = dt, dt**2
    z = y = torch.zeros(x.shape[0], len(A), dtype=torch.complex128)  # (B, P)
    out = []
    for t in range(x.shape[1]):
        v = x[:, t].to(B.dtype) @ B.T  # (B, P)
        z, y = m[0] * z + m[1] * y + fz * v, m[2] * z + m[3] * y + fy * v
        out.append((y @ C.T).real + layer.D * x[:, t])  # (B, H)
    return torch.stack(out, 1), torch.stack([z, y], -1)


@pytest.mark.parametrize("disc", ["linoss-im", "linoss-imex"])
@pytest.mark.parametrize("backend", ["naive", "scan"])
@pytest.mark.parametrize("L", [37, 257])
def test_scan_with_jordan_blocks_equals_the_explicit_loop(disc, backend, L):
    torch.manual_seed(0)
    layer = LinOSS(d_model=3, d_state=6, discretizer=disc, backend=backend, dtype=F64)
    with torch.no_grad():
        layer.A_diag[0] = 0.0  # A = 0: M = [[1, 0], [Δ, 1]], a Jordan block in both schemes
        layer.A_diag[1] = -0.7  # ReLU makes it 0 too
        layer.steps[2], layer.A_diag[2] = 0.0, 16.0  # Δ = 0.5, Δ²A = 4: IMEX's defective block at −1
    x = torch.randn(2, L, 3, dtype=F64)
    y, state = layer.forward_with_state(x)
    y_ref, h_ref = _explicit_loop(layer, x)
    torch.testing.assert_close(y, y_ref.detach(), rtol=1e-10, atol=1e-10 * (1 + y_ref.abs().max().item()))
    torch.testing.assert_close(state["h"], h_ref.detach(), rtol=1e-10, atol=1e-10 * (1 + h_ref.abs().max().item()))


# parameters --------------------------------------------------------------------------------
def test_parameter_count_at_H64_P64_is_16576():
    """2P + 4PH + H (models.md §7.2, §12.2); the 'paper' preset has P = 64."""
    layer = LinOSS(d_model=64, **get_registry().core("linoss").preset("paper"))
    assert sum(p.numel() for p in layer.parameters()) == 16_576
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert shapes == {"A_diag": (64,), "steps": (64,), "B": (64, 64, 2), "C": (64, 64, 2), "D": (64,)}


def test_init_follows_the_reference():
    layer = LinOSS(d_model=16, d_state=400)
    dt = torch.sigmoid(layer.steps)
    assert 0.5 <= dt.min() and dt.max() < 1 / (1 + math.exp(-1)) + 1e-6  # steps ~ U[0, 1)
    assert layer.steps.min() >= -1e-6 and layer.steps.max() < 1 + 1e-6
    assert layer.A_diag.min() >= 0 and layer.A_diag.max() < 1
    assert layer.B.abs().max() <= 1 / math.sqrt(16) and layer.C.abs().max() <= 1 / math.sqrt(400)
    assert layer.check_stability() < 0.54  # max Δ²A at init (models.md §7.4)


def test_state_is_complex_B_P_2_and_forward_starts_from_it():
    layer = LinOSS(d_model=3, d_state=5, dtype=F64)
    state = layer.init_state(2)
    assert state["h"].shape == (2, 5, 2) and state["h"].dtype == torch.complex128
    assert layer.init_state(1, dtype=torch.float32)["h"].dtype == torch.complex64
    x = torch.randn(2, 9, 3, dtype=F64)
    _, s = layer.forward_with_state(x)
    y_ref, _ = _explicit_loop(layer, torch.cat([x, x], 1))
    torch.testing.assert_close(layer(x, s), y_ref[:, 9:].detach())


def test_optim_hints():
    assert LinOSS(d_model=2, d_state=3).optim_hints() == {}  # the reference: one lr, no decay
    hints = LinOSS(d_model=2, d_state=3, ssm_lr=1e-4).optim_hints()
    assert set(hints) == {"A_diag", "steps"} and all(h.lr == 1e-4 and h.weight_decay == 0.0 for h in hints.values())


# the IMEX rule ----------------------------------------------------------------------------
def test_imex_init_range_that_breaks_the_rule_is_refused():
    bad = {"d_model": 4, "discretizer": "linoss-imex", "A_max": 10.0, "dt_max": 0.9}
    with pytest.raises(ValidationError, match=r"Δ²A ≤ 4.*A_max.*dt_max"):
        LinOSSParams(**bad)
    with pytest.raises(ValueError, match=r"Δ²A ≤ 4.*A_max.*dt_max"):
        LinOSS(**bad)
    with pytest.raises(ValueError, match="dt_scale"):
        LinOSS(d_model=4, discretizer="linoss-imex", dt_scale=3.0)  # (0.731·3)²·1 = 4.8
    LinOSSParams(**{**bad, "discretizer": "linoss-im"})  # IM is stable for every A ≥ 0
    LinOSS(d_model=4, discretizer="linoss-imex", A_max=7.4, dt_max=0.73)  # 0.73²·7.4 = 3.94


def test_check_stability_after_perturbing_A():
    torch.manual_seed(0)
    layer = LinOSS(d_model=3, d_state=6, discretizer="linoss-imex")
    assert layer.check_stability() <= 4
    x = torch.randn(1, 5, 3)
    layer(x)
    with torch.no_grad():
        layer.A_diag[4] = 100.0  # Δ ≥ 0.5, so Δ²A ≥ 25
    with pytest.raises(UnstableDiscretizationError, match=r"Δ²A ≤ 4.*oscillator 4 \(Δ²A = .*linoss-im"):
        layer.check_stability()
    with pytest.raises(UnstableDiscretizationError, match="Δ²A ≤ 4"):
        layer(x)  # forward checks too (one max over P)
    with pytest.raises(ValueError, match="Δ²A ≤ 4"):
        layer.init_state(1)  # once per stream; step itself does not check
    with torch.no_grad():
        layer.A_diag[4] = float("nan")
    with pytest.raises(UnstableDiscretizationError):
        layer.check_stability()

    im = LinOSS(d_model=3, d_state=6, discretizer="linoss-im")
    with torch.no_grad():
        im.A_diag[4] = 100.0
    assert im.check_stability() >= 25  # reported, not refused: IM is stable for every A ≥ 0
    assert torch.isfinite(im(torch.randn(1, 50, 3))).all()


# bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,field", [
    ({"dt_min": -0.1}, "dt_min"),
    ({"dt_min": 0.0}, "dt_min"),
    ({"dt_max": 1.0}, "dt_max"),
    ({"dt_min": 0.6, "dt_max": 0.55}, "dt_min"),
    ({"A_min": -1.0}, "A_min"),
    ({"A_min": 2.0, "A_max": 1.0}, "A_min"),
    ({"dt_scale": -2.0}, "dt_scale"),
    ({"d_state": 0}, "d_state"),
])
def test_bad_init_ranges_are_refused_by_params_and_constructor(kw, field):
    with pytest.raises(ValidationError, match=field):
        LinOSSParams(d_model=4, **kw)
    with pytest.raises(ValueError, match=field):
        LinOSS(d_model=4, **kw)


def test_unknown_or_unsuited_discretizer():
    with pytest.raises(UnknownNameError, match="did you mean 'linoss-imex'"):
        LinOSS(d_model=2, d_state=3, discretizer="linoss-imx")
    with pytest.raises(ValueError, match="block2x2"):
        LinOSS(d_model=2, d_state=3, discretizer="zoh")
    with pytest.raises(ValueError, match="block2x2"):
        linoss_im(torch.ones(3), torch.ones(3, 2), 0.5, structure="diag")
    with pytest.raises(ValueError, match="P = 3"):
        linoss_imex(torch.ones(3), torch.ones(4, 2), 0.5)


def test_discretizers_are_registered_by_this_plugin_and_resolved_by_name():
    reg = get_registry()
    for name in ("linoss-im", "linoss-imex"):
        entry = reg.discretizer(name)
        assert entry.structures == frozenset({"block2x2"}) and entry.provider.dist == "zoo-linoss"
    bound = LinOSS(d_model=2, d_state=3, discretizer="linoss-imex")._discretize
    assert bound.func is linoss_imex and bound.keywords == {"structure": "block2x2"} and bound.dt2A_max == 4.0
    assert LinOSS(d_model=2, d_state=3)._discretize.func is linoss_im
    assert reg.core("linoss").preset("imex")["discretizer"] == "linoss-imex"


# Δ rescaling (continuous_time) ------------------------------------------------------------
@pytest.mark.parametrize("disc", ["linoss-im", "linoss-imex"])
def test_rescale_dt_is_the_same_system_with_twice_the_step(disc):
    torch.manual_seed(0)
    layer = LinOSS(d_model=3, d_state=5, discretizer=disc, dtype=F64)
    torch.manual_seed(0)
    built = LinOSS(d_model=3, d_state=5, discretizer=disc, dt_scale=2.0, dtype=F64)
    dt = torch.sigmoid(layer.steps)
    layer.rescale_dt(2.0)
    assert layer.dt_scale == 2.0
    torch.testing.assert_close(layer.dt(), 2 * dt)
    x = torch.randn(2, 11, 3, dtype=F64)
    torch.testing.assert_close(layer(x), built(x), rtol=0, atol=0)
    ref = (linoss_im if disc == "linoss-im" else linoss_imex)(torch.relu(layer.A_diag), layer.B, 2 * dt)
    torch.testing.assert_close(layer._discrete(layer.B).a, ref.a)


@pytest.mark.parametrize("disc", ["linoss-im", "linoss-imex"])
def test_doubling_dt_on_a_held_input_converges_at_first_order(disc):
    """Δ·2 on the signal vs Δ on the same signal held for two samples: both are first-order
    schemes for one ODE, so outputs at matching times differ by O(Δ), halving with Δ."""
    torch.manual_seed(0)
    base = LinOSS(d_model=2, d_state=6, discretizer=disc, dtype=F64)
    gaps = []
    for level in range(3):
        s, n = 0.1 / 2**level, 100 * 2**level  # dt_scale and coarse samples: T = n·2Δ fixed
        fine = LinOSS(d_model=2, d_state=6, discretizer=disc, dt_scale=s, dtype=F64)
        fine.load_state_dict(base.state_dict())
        coarse = LinOSS(d_model=2, d_state=6, discretizer=disc, dt_scale=s, dtype=F64)
        coarse.load_state_dict(base.state_dict())
        coarse.rescale_dt(2.0)
        t = torch.arange(1, n + 1, dtype=F64) / n * 6  # (n,) the same signal at every level
        u = torch.stack([torch.sin(t), torch.cos(2 * t)], -1)[None]  # (1, n, 2)
        with torch.no_grad():
            y_coarse = coarse(u)  # step m covers (2mΔ, 2(m+1)Δ]
            y_fine = fine(u.repeat_interleave(2, 1))[:, 1::2]  # held: two steps of Δ per sample
        gaps.append(((y_coarse - y_fine).abs().max() / y_fine.abs().max()).item())
    assert gaps[0] > 1e-4  # Δ matters: the comparison is not vacuous
    for a, b in zip(gaps, gaps[1:], strict=False):
        assert 1.6 < a / b < 2.5, gaps


def test_imex_rescale_that_breaks_the_rule_is_refused_and_changes_nothing():
    layer = LinOSS(d_model=2, d_state=4, discretizer="linoss-imex", A_min=1.0, A_max=1.0)
    with pytest.raises(UnstableDiscretizationError, match=r"Δ²A ≤ 4.*dt_scale left at 1"):
        layer.rescale_dt(4.0)  # Δ > 0.5·4, so Δ²A > 4 for every oscillator
    assert layer.dt_scale == 1.0
    layer.rescale_dt(2.0)  # Δ < 1.462: Δ²A < 2.14
    with pytest.raises(ValueError, match="positive finite"):
        layer.rescale_dt(0.0)


def test_rescale_sampling_rate_on_a_model_updates_the_spec():
    from zoo_core.build import build_model
    from zoo_core.nn.model import rescale_sampling_rate

    spec = {"schema_version": 1, "task": {"kind": "sequence", "outputs": 2}, "input": {"channels": 3},
            "model": {"d_model": 4, "depth": 2, "core": {"kind": "linoss", "preset": "tiny"}}}
    model = build_model(spec, seed=0)
    rescale_sampling_rate(model, 2.0)
    assert all(c.dt_scale == 2.0 for c in model.cores())
    assert model.spec["model"]["core"]["dt_scale"] == 2.0
