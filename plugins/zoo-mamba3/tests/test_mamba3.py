"""Mamba-3 (SISO): the scan backends against each other and against an independent float64
re-derivation, the whole mixer against the equations, streaming, Δ rescaling, bad input.

There is no CPU-runnable peer package (mamba_ssm's Mamba3 needs its Triton kernels' imports), so
correctness rests on (a) the sequential reference read from the release's ``mamba3_siso_step_ref``
(tests/ops/triton/test_mamba3_siso.py), (b) the L × L mixing matrix materialised here from the
equations, term by term, (c) the whole mixer written out step by step as that reference does, and
(d) step = forward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from zoo_core.build import build_model
from zoo_core.errors import CoreArgumentError, SpecError
from zoo_core.nn.model import rescale_sampling_rate
from zoo_core.testing.helpers import assert_slice_backward_linear
from zoo_mamba3.core import Mamba3
from zoo_mamba3.params import Mamba3Params
from zoo_mamba3.scan import trap_scan_chunked, trap_scan_sequential

F64 = torch.float64
SCANS = {"sequential": trap_scan_sequential, "chunked": trap_scan_chunked}


def _inputs(Bt: int = 2, L: int = 11, H: int = 3, P: int = 5, N: int = 4, *, seed: int = 0, carry: bool = True,
            trapezoidal: bool = True, per_step: bool = True) -> dict[str, torch.Tensor | None]:
    """Random scan inputs; A per step and head (the release's data-dependent A), or per head only."""
    g = torch.Generator().manual_seed(seed)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g, dtype=F64)

    return {
        "x": r(Bt, L, H, P), "dt": F.softplus(r(Bt, L, H)),
        "A": -torch.rand(*((Bt, L, H) if per_step else (H,)), generator=g, dtype=F64) * 2 - 0.1,
        "B": r(Bt, L, H, N), "C": r(Bt, L, H, N),
        "lam": torch.sigmoid(r(Bt, L, H)) if trapezoidal else None,
        "h0": r(Bt, H, P, N) if carry else None,
        "x_prev": r(Bt, H, P) if carry and trapezoidal else None,
        "B_prev": r(Bt, H, N) if carry and trapezoidal else None,
    }


def _call(fn, inp, chunk_size=4):
    return fn(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["lam"], inp["h0"], inp["x_prev"], inp["B_prev"],
              chunk_size=chunk_size)


def mixing_matrix_output(inp) -> tuple[torch.Tensor, torch.Tensor]:
    """y and h_L re-derived from the equations, independently of both backends: the L × L matrix
    M[t, s] = (C_t·B_s)(γ_s Π_{r=s+1..t} α_r) + (C_t·B_{s})·β_{s+1} Π_{r=s+2..t} α_r [s < t],
    plus the carried terms Π_{r≤t} α_r C_t h0 and β_0 Π_{r=1..t} α_r (C_t·B_prev) x_prev.
    Products of α are taken one factor at a time (no cumulative sums, no chunks)."""
    x, dt, A, B, C, lam = inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["lam"]
    Bt, L, H, P = x.shape
    alpha = torch.exp(dt * A)
    gamma = dt if lam is None else lam * dt
    beta = torch.zeros_like(dt) if lam is None else (1 - lam) * dt * alpha

    def prod(lo: int, hi: int) -> torch.Tensor:  # Π_{r=lo..hi} α_r, (Bt, H)
        out = torch.ones(Bt, H, dtype=F64)
        for r in range(lo, hi + 1):
            out = out * alpha[:, r]
        return out

    M = torch.zeros(Bt, H, L, L, dtype=F64)
    for t in range(L):
        for s in range(t + 1):
            cb = (C[:, t] * B[:, s]).sum(-1)  # (Bt, H)
            M[:, :, t, s] = cb * gamma[:, s] * prod(s + 1, t)
            if s < t:
                M[:, :, t, s] += cb * beta[:, s + 1] * prod(s + 2, t)
    y = torch.einsum("bhts,bshp->bthp", M, x)
    if inp["h0"] is not None:
        for t in range(L):
            y[:, t] += prod(0, t)[..., None] * torch.einsum("bhpn,bhn->bhp", inp["h0"], C[:, t])
    if inp["x_prev"] is not None:
        for t in range(L):
            cb = (C[:, t] * inp["B_prev"]).sum(-1)
            y[:, t] += (beta[:, 0] * prod(1, t) * cb)[..., None] * inp["x_prev"]
    # the final state from the same terms: h_L = Σ_s w_s x_s B_sᵀ + carried
    h = torch.zeros(Bt, H, P, B.shape[-1], dtype=F64)
    for s in range(L):
        w = gamma[:, s] * prod(s + 1, L - 1)
        if s + 1 < L:
            w = w + beta[:, s + 1] * prod(s + 2, L - 1)
        h += w[..., None, None] * x[:, s, :, :, None] * B[:, s, :, None, :]
    if inp["h0"] is not None:
        h += prod(0, L - 1)[..., None, None] * inp["h0"]
    if inp["x_prev"] is not None:
        h += (beta[:, 0] * prod(1, L - 1))[..., None, None] * inp["x_prev"][..., None] * inp["B_prev"][..., None, :]
    return y, h


# the scan: backends against the re-derivation and each other -------------------------------------
@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("carry,trapezoidal,per_step", [(False, True, True), (True, True, True), (True, False, True),
                                                        (True, True, False)])
def test_scan_equals_the_mixing_matrix(name, carry, trapezoidal, per_step):
    inp = _inputs(L=9, carry=carry, trapezoidal=trapezoidal, per_step=per_step)
    y, h = _call(SCANS[name], inp, chunk_size=4)
    y_ref, h_ref = mixing_matrix_output(inp)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("L,Q", [(1, 4), (7, 1), (13, 4), (12, 4), (12, 3), (13, 13), (13, 64), (17, 5)])
def test_chunked_equals_sequential_outputs_state_and_all_gradients(L, Q):
    """Odd lengths, lengths not a multiple of the chunk, one chunk, chunk 1, carried state."""
    inp = _inputs(L=L, seed=L * 31 + Q)
    leaves = {k: v.clone().requires_grad_(True) for k, v in inp.items() if v is not None}
    full = {**inp, **leaves}
    res = {}
    for name, fn in SCANS.items():
        y, h = _call(fn, full, chunk_size=Q)
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=F64)  # the same cotangents
        gh = torch.randn(h.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        grads = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), list(leaves.values()))
        res[name] = (y, h, dict(zip(leaves, grads, strict=True)))
    (ys, hs, gs), (yc, hc, gc) = res["sequential"], res["chunked"]
    torch.testing.assert_close(yc, ys, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(hc, hs, rtol=1e-10, atol=1e-10)
    assert set(gs) == {"x", "dt", "A", "B", "C", "lam", "h0", "x_prev", "B_prev"}
    for k in gs:
        torch.testing.assert_close(gc[k], gs[k], rtol=1e-9, atol=1e-9, msg=lambda m, k=k: f"grad of {k}: {m}")


def test_euler_without_lambda_has_no_previous_step_term():
    """use_trapezoidal false: h_t = α_t h_{t−1} + Δ_t x_t B_tᵀ (x_prev/B_prev play no part)."""
    inp = _inputs(L=6, trapezoidal=False)
    y, h = _call(trap_scan_chunked, {**inp, "x_prev": torch.ones(2, 3, 5, dtype=F64), "B_prev": None})
    y0, h0 = _call(trap_scan_sequential, inp)
    torch.testing.assert_close(y, y0)
    torch.testing.assert_close(h, h0)


# the mixer against the equations ------------------------------------------------------------------
def _core(**kw) -> Mamba3:
    torch.manual_seed(0)
    params = {"d_model": 5, "d_state": 4, "nheads": 2, "ngroups": 2, "chunk_size": 3, "dtype": F64, **kw}
    core = Mamba3(**params)
    with torch.no_grad():  # move every parameter off its init (biases 1, norms 1, D 1) so each is seen
        for p in core.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return core


def mixer_by_hand(core: Mamba3, u: torch.Tensor) -> torch.Tensor:
    """The released Mamba3's forward from its parameters, step by step as its ``mamba3_siso_step_ref``:
    the angle state advanced by π·tanh(θ)·Δ and wrapped, the pairs (2r, 2r+1) turned by complex
    multiplication, h = α h + β k_prev v_prev + γ k v, out = (h·q + D v)·SiLU(z), then out_proj."""
    Bt, L, _ = u.shape
    H, P, N, G, Di, R = core.nheads, core.headdim, core.d_state, core.ngroups, core.d_inner, core.n_angles
    proj = u @ core.in_proj.weight.T
    z, x, Bg, Cg, dd_dt, dd_A, trap, ang = proj.split([Di, Di, G * N, G * N, H, H, H, R], -1)
    dt = F.softplus(dd_dt + core.dt_bias) * core.dt_scale
    A = -torch.clamp(F.softplus(dd_A), min=core.A_floor)
    rms = lambda v, w: v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-5) * w  # noqa: E731
    Bg, Cg = rms(Bg.reshape(Bt, L, G, N), core.B_norm.weight), rms(Cg.reshape(Bt, L, G, N), core.C_norm.weight)
    per = H // G
    k_all = torch.stack([Bg[:, :, h // per] + core.B_bias[h, 0] for h in range(H)], 2)  # (Bt, L, H, N)
    q_all = torch.stack([Cg[:, :, h // per] + core.C_bias[h, 0] for h in range(H)], 2)
    ang = torch.tanh(ang) * torch.pi  # (Bt, L, R)
    v_all = x.reshape(Bt, L, H, P)

    def turn(v, phi):  # v (Bt, H, N), phi (Bt, H, R)
        c = torch.complex(v[..., 0:2 * R:2], v[..., 1:2 * R:2]) * torch.exp(1j * phi)
        return torch.cat([torch.stack([c.real, c.imag], -1).flatten(-2), v[..., 2 * R:]], -1)

    phi = torch.zeros(Bt, H, R, dtype=F64)
    h = torch.zeros(Bt, H, P, N, dtype=F64)
    k_prev, v_prev = torch.zeros(Bt, H, N, dtype=F64), torch.zeros(Bt, H, P, dtype=F64)
    outs = []
    for t in range(L):
        phi = phi + ang[:, t, None, :] * dt[:, t, :, None]
        phi = phi - 2 * torch.pi * torch.floor(phi / (2 * torch.pi))
        q, k, v = turn(q_all[:, t], phi), turn(k_all[:, t], phi), v_all[:, t]
        lam = torch.sigmoid(trap[:, t])
        alpha = torch.exp(A[:, t] * dt[:, t])
        beta, gamma = (1 - lam) * dt[:, t] * alpha, lam * dt[:, t]
        h = (alpha[..., None, None] * h + beta[..., None, None] * v_prev[..., None] * k_prev[..., None, :]
             + gamma[..., None, None] * v[..., None] * k[..., None, :])
        out = torch.einsum("bhpn,bhn->bhp", h, q) + core.D[:, None] * v
        if core.outproj_norm:  # the release's RMSNormGated(norm_before_gate=True, group_size=headdim)
            out = rms(out, 1.0).reshape(Bt, Di) * core.norm.weight
        outs.append(out.reshape(Bt, Di) * F.silu(z[:, t]))
        k_prev, v_prev = k, v
    return torch.stack(outs, 1) @ core.out_proj.weight.T


@pytest.mark.parametrize("backend,outproj_norm", [("sequential", False), ("chunked", False), ("chunked", True)])
def test_mixer_equals_the_equations(backend, outproj_norm):
    core = _core(backend=backend, dt_scale=1.5, outproj_norm=outproj_norm)
    u = torch.randn(2, 8, 5, dtype=F64)
    torch.testing.assert_close(core(u), mixer_by_hand(core, u), rtol=1e-9, atol=1e-9)


def test_parameter_names_and_shapes_are_the_releases():
    """Names and shapes equal the released Mamba3's (SISO), so its state dict loads by name; in_proj's
    width is 2·Di + 2·G·N + 3·H + R as there (R = N·rope_fraction / 2 angles)."""
    core = Mamba3(d_model=6, d_state=8, expand=2, headdim=4, ngroups=3)
    H, N, G, Di, R = 3, 8, 3, 12, 2
    shapes = {k: tuple(v.shape) for k, v in core.state_dict().items()}
    assert shapes == {"in_proj.weight": (2 * Di + 2 * G * N + 3 * H + R, 6), "dt_bias": (H,), "D": (H,),
                      "B_norm.weight": (N,), "C_norm.weight": (N,), "B_bias": (H, 1, N), "C_bias": (H, 1, N),
                      "out_proj.weight": (6, Di)}
    assert Mamba3(d_model=6, d_state=8, headdim=4, rope_fraction=1.0).n_angles == 4
    assert Mamba3(d_model=6, d_state=6, headdim=4).n_angles == 1  # ⌊6 · 0.5⌋ = 3, rounded down to 2 states
    normed = Mamba3(d_model=6, d_state=8, headdim=4, outproj_norm=True)
    assert tuple(normed.norm.weight.shape) == (12,) and normed.norm.group_size == 4  # per head, as the release


def test_init_follows_the_reference():
    core = Mamba3(d_model=64, d_state=16, headdim=8, dt_min=1e-3, dt_max=0.1)
    dt = F.softplus(core.dt_bias)
    assert bool(((dt >= 1e-3 - 1e-7) & (dt <= 0.1 + 1e-7)).all())
    assert torch.equal(core.D, torch.ones(16)) and torch.equal(core.B_bias, torch.ones(16, 1, 16))
    with torch.no_grad():
        p = core._project(torch.randn(2, 50, 64, generator=torch.Generator().manual_seed(0)), None)
    assert bool((p["A"] <= -1e-4).all()) and p["A"].shape == (2, 50, 16)  # data-dependent, at most −A_floor
    # each step turns B and C by at most π·Δ_t (|tanh| < 1), so as slowly as Δ is small (≤ 0.1 from dt_bias alone)
    turn = torch.remainder(torch.diff(p["angle"], dim=1) + torch.pi, 2 * torch.pi) - torch.pi  # (2, 49, H, R)
    assert 0 < float(turn.abs().max())
    assert bool((turn.abs() <= torch.pi * p["dt"][:, 1:, :, None] + 1e-6).all())


def test_switches_drop_their_parameters():
    core = Mamba3(d_model=4, d_state=3, headdim=4, use_rope=False, use_trapezoidal=False, use_bc_norm=False,
                  use_bc_bias=False)
    assert set(core.state_dict()) == {"in_proj.weight", "dt_bias", "D", "out_proj.weight"}
    assert core.in_proj.out_features == 8 + 8 + 3 + 3 + 2 + 2
    assert set(core.init_state(1)) == {"ssm"}


# streaming ------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sequential", "chunked"])
def test_step_and_chunked_streaming_equal_the_whole(backend):
    """Pieces of odd lengths (crossing chunk boundaries) carry h, the last x and B and the angle."""
    core = _core(backend=backend)
    u = torch.randn(2, 17, 5, dtype=F64)
    whole, final = core.forward_with_state(u)
    state, ys = None, []
    for lo, hi in ((0, 5), (5, 6), (6, 13), (13, 17)):
        y, state = core.forward_with_state(u[:, lo:hi], state)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys, 1), whole, rtol=1e-10, atol=1e-10)
    for k in final:
        torch.testing.assert_close(state[k], final[k], rtol=1e-10, atol=1e-10)
    state, ys = core.init_state(2, dtype=F64), []
    for t in range(u.shape[1]):
        y, state = core.step(u[:, t], state)
        ys.append(y)
    torch.testing.assert_close(torch.stack(ys, 1), whole, rtol=1e-10, atol=1e-10)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in final.items()}


def test_the_carried_previous_step_matters():
    """Dropping x_prev/B_prev or the angle from a carried state changes the continuation (so the
    streaming test above could fail)."""
    core = _core()
    u = torch.randn(1, 9, 5, dtype=F64)
    _, state = core.forward_with_state(u[:, :4])
    y, _ = core.forward_with_state(u[:, 4:], state)
    for key in ("x_prev", "angle"):
        bad = {**state, key: torch.zeros_like(state[key])}
        assert not torch.allclose(core.forward_with_state(u[:, 4:], bad)[0], y)


# Δ rescaling ------------------------------------------------------------------------------------
def test_dt_rescaling_multiplies_every_step_and_the_angle():
    core = _core()
    u = torch.randn(1, 6, 5, dtype=F64)
    p1 = core._project(u, None)
    core.rescale_dt(2.0)
    assert core.dt_scale == 2.0
    p2 = core._project(u, None)
    torch.testing.assert_close(p2["dt"], 2 * p1["dt"])
    torch.testing.assert_close(p2["angle"], 2 * p1["angle"] - 2 * torch.pi * torch.floor(p1["angle"] / torch.pi))
    twin = _core(dt_scale=2.0)
    torch.testing.assert_close(core(u), twin(u))


def test_rescale_sampling_rate_on_a_model():
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 5, "depth": 2, "core": {"kind": "mamba3", "preset": "tiny"}}}
    model = build_model(spec, seed=0)
    x = torch.randn(1, 7, 2)
    before = model(x)
    rescale_sampling_rate(model, 0.5)
    assert all(c.dt_scale == 0.5 for c in model.cores())
    assert not torch.allclose(model(x), before)


# bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad,field,rule", [
    ({"headdim": 3}, "headdim", "must divide the inner width expand · d_model"),
    ({"nheads": 3}, "nheads", "must divide the inner width expand · d_model"),
    ({"headdim": 4, "nheads": 4}, "nheads · headdim", "must equal the inner width expand · d_model"),
    ({"headdim": 2, "ngroups": 3}, "ngroups", "must divide the number of heads"),
    ({"d_state": 1}, "d_state", "leaves no pair of states to rotate"),
    ({"rope_fraction": 0.25}, "rope_fraction", "must be 0.5 or 1.0"),
    ({"chunk_size": 0}, "chunk_size", "greater than or equal to 1"),
    ({"chunk_size": -4}, "chunk_size", "greater than or equal to 1"),
    ({"A_floor": 0.0}, "A_floor", "greater than 0"),
    ({"A_init_min": 1.0}, "A_init_min", "Extra inputs are not permitted"),  # Mamba3Simple's fixed A is gone
    ({"dt_limit_min": 0.5, "dt_limit_max": 0.1}, "dt_limit_min", "must not exceed dt_limit_max"),
    ({"dt_min": 0.2, "dt_max": 0.1}, "dt_min", "must not exceed dt_max"),
    ({"dt_scale": 0.0}, "dt_scale", "greater than 0"),
    ({"d_state": 4.0}, "d_state", "valid integer"),
    ({"conv_bias": True}, "conv_bias", "Extra inputs are not permitted"),
])
def test_bad_params_are_rejected_naming_the_field(bad, field, rule):
    with pytest.raises(ValidationError) as info:
        Mamba3Params.model_validate({"d_model": 4, "d_state": 4, **bad})
    assert field in str(info.value) and rule in str(info.value)
    if "conv_bias" not in bad and "A_init_min" not in bad:  # an unknown keyword is Python's TypeError at the constructor
        with pytest.raises(CoreArgumentError, match=f"Mamba3: invalid constructor argument.*{rule}"):
            Mamba3(**{"d_model": 4, "d_state": 4, **bad})


def test_heads_resolve_from_either_or_the_gcd_default():
    assert Mamba3Params.model_validate({"d_model": 64}).heads == 2  # headdim gcd(128, 64) = 64
    assert Mamba3Params.model_validate({"d_model": 5, "nheads": 2}).heads == 2
    assert Mamba3Params.model_validate({"d_model": 6, "headdim": 4}).heads == 3
    assert Mamba3(d_model=5, d_state=4, nheads=2).headdim == 5


def test_bad_spec_error_names_the_key_path():
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 8, "depth": 1, "core": {"kind": "mamba3", "preset": "tiny", "chunk_size": 0}}}
    with pytest.raises(SpecError, match="chunk_size"):
        build_model(spec)


def test_backend_names_select_the_scan():
    for setting, name in (("sequential", "mamba3-sequential"), ("chunked", "mamba3-chunked"), ("naive", "mamba3-sequential"),
                          ("auto", "mamba3-chunked")):
        core = Mamba3(d_model=4, d_state=4, headdim=4, backend=setting)
        assert core.backend_choice.entries["scan"].name == name, setting


def test_long_sequence_is_finite_in_float32():
    core = Mamba3(d_model=8, d_state=8, headdim=4, chunk_size=64)
    x = torch.randn(1, 1000, 8, requires_grad=True)
    y = core(x)
    assert bool(torch.isfinite(y).all())
    y.square().mean().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


@pytest.mark.parametrize("drop", ["x_prev", "angle"])
def test_a_state_missing_a_part_is_refused_naming_it(drop):
    """Without the check, a state lacking x_prev or angle silently dropped the β term or restarted the rotary."""
    core = _core()
    state = {k: v for k, v in core.init_state(1, dtype=F64).items() if k != drop}
    with pytest.raises(ValueError, match=rf"Mamba3 state lacks \['{drop}'\].*init_state"):
        core.forward_with_state(torch.randn(1, 3, 5, dtype=F64), state)
    with pytest.raises(ValueError, match=rf"Mamba3 state lacks \['{drop}'\]"):
        core.step(torch.randn(1, 5, dtype=F64), state)


@pytest.mark.parametrize("name", list(SCANS))
def test_the_loop_backward_does_not_grow_a_slice_per_chunk_or_step(name):
    """Both loops (over chunk states, over steps) take their pieces by ``unbind`` (a slice per chunk or
    step would backpropagate a full-size zero tensor for each, quadratic in the length): the backward's
    slice nodes do not multiply with the length."""
    def outputs_at(L):  # 4 and 16 chunks of 4
        inp = {k: (v.requires_grad_() if v is not None else None) for k, v in _inputs(L=L).items()}
        return _call(SCANS[name], inp, chunk_size=4)

    assert_slice_backward_linear(outputs_at, 16)
