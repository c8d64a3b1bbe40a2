"""RG-LRU's own maths: the block re-derived by hand in float64 (the paper's a = σ(Λ)^(c·r), not log
space), the fast path against the reference at chunk boundaries (outputs, final state, every
gradient), the document reset, the Λ initialisations, the bounded sqrt, and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

import zoo_rglru.core as rglru_core
from zoo_core.build import build_model
from zoo_core.errors import CoreArgumentError, SpecError
from zoo_core.nn.model import rescale_sampling_rate
from zoo_rglru.core import MAX_SQRT_GRADIENT, RGLRU, bounded_sqrt, lambda_init
from zoo_rglru.params import RGLRUParams

F64 = torch.float64
H, W, HEADS, K = 5, 9, 3, 4


def _core(backend: str = "naive", **kw) -> RGLRU:
    torch.manual_seed(0)
    core = RGLRU(d_model=H, lru_width=W, num_heads=HEADS, conv_width=K, backend=backend, dtype=F64, **kw)
    with torch.no_grad():  # away from init: nonzero biases, gates far from 1/2
        for p in core.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return core


def _explicit(core: RGLRU, u: torch.Tensor, state: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The block written out step by step from the paper and the reference code, float64."""
    Wh = core.lru_width // core.num_heads
    x = u @ core.linear_x.weight.T + core.linear_x.bias  # (B, L, W)
    yb = F.gelu(u @ core.linear_y.weight.T + core.linear_y.bias, approximate=core.gelu_approximate)  # (B, L, W)
    seq = torch.cat([state["conv"], x.transpose(1, 2)], -1)  # (B, W, K−1+L)
    h, outs = state["h"].clone(), []
    for t in range(u.shape[1]):
        xc = (seq[:, :, t : t + core.conv_width] * core.conv_1d.weight[:, 0]).sum(-1) + core.conv_1d.bias  # (B, W)
        r, i = torch.empty_like(xc), torch.empty_like(xc)
        for hd in range(core.num_heads):
            sl = slice(hd * Wh, (hd + 1) * Wh)
            r[:, sl] = torch.sigmoid(xc[:, sl] @ core.recurrent_gate_weight[hd] + core.recurrent_gate_bias[hd])
            i[:, sl] = torch.sigmoid(xc[:, sl] @ core.input_gate_weight[hd] + core.input_gate_bias[hd])
        a = torch.sigmoid(core.Lambda) ** (core.c * r)  # (B, W)
        for b in range(u.shape[0]):
            if t == 0 and state["start"][b] == 1:  # a document starts: a = 0, multiplier 1
                h[b] = i[b] * xc[b]
            else:
                h[b] = a[b] * h[b] + torch.sqrt(1 - a[b] ** 2) * (i[b] * xc[b])
        outs.append((h * yb[:, t]) @ core.linear_out.weight.T + core.linear_out.bias)
    return torch.stack(outs, 1), h


def _state(B: int, start: list[float]) -> dict:
    g = torch.Generator().manual_seed(5)
    return {"conv": torch.randn(B, W, K - 1, generator=g, dtype=F64), "h": torch.randn(B, W, generator=g, dtype=F64),
            "start": torch.tensor(start, dtype=F64)}


@pytest.mark.parametrize("backend", ["naive", "scan", "sequential", "auto"])
def test_forward_is_the_block_written_out(backend):
    core = _core(backend)
    u = torch.randn(2, 13, H, dtype=F64)
    state = _state(2, [1.0, 0.0])  # one document starts here, one continues from a carried state
    with torch.no_grad():
        y, final = core.forward_with_state(u, state)
        y_ref, h_ref = _explicit(core, u, state)
    torch.testing.assert_close(y, y_ref, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(final["h"], h_ref, rtol=1e-11, atol=1e-12)
    assert torch.equal(final["start"], torch.zeros(2, dtype=F64))


def _grads(core: RGLRU, u: torch.Tensor, state: dict) -> dict[str, torch.Tensor]:
    u = u.clone().requires_grad_(True)
    h0 = state["h"].clone().requires_grad_(True)
    y, final = core.forward_with_state(u, {**state, "h": h0})
    g = torch.Generator().manual_seed(9)
    dy, dh = (torch.randn(t.shape, generator=g, dtype=F64) for t in (y, final["h"]))
    loss = (y * dy).sum() + (final["h"] * dh).sum()
    names = [n for n, _ in core.named_parameters()]
    grads = torch.autograd.grad(loss, [u, h0, *core.parameters()])
    return {"y": y, "h": final["h"], "conv": final["conv"], "grad u": grads[0], "grad h0": grads[1],
            **{f"grad {n}": gr for n, gr in zip(names, grads[2:], strict=True)}}


@pytest.mark.parametrize("L", [1, 7, 8, 9, 16, 17, 33])  # the parallel scan's chunk is 8: boundaries and remainders
def test_parallel_scan_equals_the_reference_loop_with_every_gradient(L):
    u = torch.randn(2, L, H, dtype=F64)
    state = _state(2, [0.0, 1.0])
    ref = _grads(_core("sequential"), u, state)
    for backend in ("scan", "naive"):
        out = _grads(_core(backend), u, state)
        for k, v in ref.items():
            torch.testing.assert_close(out[k], v, rtol=1e-10, atol=1e-12, msg=f"{backend}, L={L}: {k}")


def test_a_fresh_sequence_starts_a_document():
    core = _core()
    u = torch.randn(2, 6, H, dtype=F64)
    with torch.no_grad():
        y = core(u)
        torch.testing.assert_close(core(u, core.init_state(2)), y, rtol=0, atol=0)
        cont = core.init_state(2)
        cont["start"].zero_()  # zero state, but no document start: the first input is scaled by sqrt(1 − a²)
        y_cont = core(u, cont)
    assert not torch.allclose(y_cont[:, 0], y[:, 0])


def test_init_state_is_constant_size_and_step_keeps_it():
    core = RGLRU(d_model=H, lru_width=W, num_heads=HEADS)
    state = core.init_state(3)
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes == {"conv": (3, W, K - 1), "h": (3, W), "start": (3,)}
    with torch.no_grad():
        for _ in range(20):
            _, state = core.step(torch.randn(3, H), state)
    assert {k: tuple(v.shape) for k, v in state.items()} == shapes


# initialisation ------------------------------------------------------------------------------
def _ks_uniform(sample: torch.Tensor, lo: float, hi: float) -> float:
    s = torch.sort(sample.to(F64)).values
    n = s.numel()
    cdf = ((s - lo) / (hi - lo)).clamp(0, 1)
    i = torch.arange(1, n + 1, dtype=F64)
    return max((i / n - cdf).max().item(), (cdf - (i - 1) / n).max().item())


@pytest.mark.parametrize("how,power", [("paper", 8.0), ("recurrentgemma", 2.0)])
def test_lambda_init_puts_the_decay_uniformly_in_its_range(how, power):
    """'paper': σ(Λ)^c ~ U[0.9, 0.999]; 'recurrentgemma': σ(Λ)² ~ U[0.81, 0.998]. Each statistic
    rejects the other init."""
    torch.manual_seed(1)
    n = 20000
    a = torch.sigmoid(lambda_init(n, 8.0, 0.9, 0.999, how))
    lo, hi = (0.9, 0.999) if how == "paper" else (0.81, 0.999**2)
    bound = 1.95 / math.sqrt(n)
    assert _ks_uniform(a**power, lo, hi) < bound
    other = 2.0 if how == "paper" else 8.0
    assert _ks_uniform(a**other, *((0.81, 0.999**2) if how == "paper" else (0.9, 0.999))) > 5 * bound


def test_float32_and_float64_builds_agree():
    torch.manual_seed(6)
    a = RGLRU(d_model=H, lru_width=W, num_heads=HEADS, dtype=torch.float32)
    torch.manual_seed(6)
    b = RGLRU(d_model=H, lru_width=W, num_heads=HEADS, dtype=F64)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(p.to(F64), q, rtol=1e-6, atol=1e-7, msg=n)


def test_bounded_sqrt_caps_the_gradient_and_is_sqrt():
    x = torch.tensor([1e-12, 0.25, 4.0], dtype=F64, requires_grad=True)
    y = bounded_sqrt(x)
    torch.testing.assert_close(y, torch.sqrt(x.detach()))
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, torch.tensor([MAX_SQRT_GRADIENT, 1.0, 0.25], dtype=F64))


@pytest.mark.parametrize("L", [1, 6])
def test_fused_gates_equal_the_autograd_chain_with_every_gradient(L, monkeypatch):
    """The parallel path's one-node gate maths (hand-written backward) against ``transition``, float64:
    a and b and the gradients into x, ``start`` and every parameter, with some channels saturated
    (r ≈ 1e−9: 1 − a² ≈ 1e−7, inside the sqrt's derivative cap) and a fractional start. The backward's
    pieces are 4 steps here: L = 6 is a whole piece and a remainder."""
    monkeypatch.setattr(rglru_core, "GATE_PIECE", 4)
    core = _core("scan")
    with torch.no_grad():
        core.recurrent_gate_bias[0, :2] = -20.0
    x = torch.randn(2, L, W, dtype=F64, requires_grad=True)
    start = torch.tensor([0.3, 1.0], dtype=F64, requires_grad=True)
    ga, gb = torch.randn(2, L, W, dtype=F64), torch.randn(2, L, W, dtype=F64)
    leaves = [x, start, *core.parameters()]
    results = []
    for fn in (core.transition, core.fused_transition):
        a, b = fn(x, start)
        grads = torch.autograd.grad((a * ga).sum() + (b * gb).sum(), leaves, allow_unused=True)
        results.append([a, b, *grads])
    names = ["a", "b", "x", "start", *(n for n, _ in core.named_parameters())]
    for n, want, got in zip(names, *results, strict=True):
        if want is None:
            assert got is None or not bool(got.any()), n
            continue
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=n)


def test_gates_saturated_at_decay_one_stay_finite():
    """r_t → 0 gives a_t → 1 and sqrt(1 − a²) → 0: outputs and gradients stay finite (float32)."""
    core = RGLRU(d_model=H, lru_width=W, num_heads=HEADS)
    with torch.no_grad():
        core.recurrent_gate_bias.fill_(-60.0)  # σ(−60) ≈ 1e−26: log a ≈ 0
    u = torch.randn(2, 50, H)
    y = core(u)
    y.square().sum().backward()
    assert bool(torch.isfinite(y).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in core.parameters())


# what it refuses -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad,field,rule", [
    ({"c": 0.0}, "c", "greater than 0"),
    ({"c": -8.0}, "c", "greater than 0"),
    ({"c": float("inf")}, "c", "finite number"),
    ({"lru_width": 36, "num_heads": 5}, "num_heads (5) must divide lru_width (36)", "block-diagonal"),
    ({"num_heads": 3}, "num_heads (3) must divide lru_width (10, = d_model)", "e.g. num_heads: 2"),
    ({"conv_width": 0}, "conv_width", "greater than or equal to 1"),
    ({"num_heads": 0}, "num_heads", "greater than or equal to 1"),
    ({"a_min": 0.99, "a_max": 0.9}, "a_min (0.99) must be smaller than a_max (0.9)", "would be empty"),
    ({"a_max": 1.0}, "a_max", "less than 1"),
    ({"a_init": "uniform"}, "a_init", "'paper' or 'recurrentgemma'"),
    ({"dt_scale": 2.0}, "dt_scale", "Extra inputs are not permitted"),
])
def test_bad_params_are_refused_naming_the_field_and_the_rule(bad, field, rule):
    with pytest.raises(ValidationError) as info:
        RGLRUParams.model_validate({"d_model": 10, **bad})
    assert field in str(info.value) and rule in str(info.value)
    if "Extra inputs" not in rule:  # (an unknown keyword is Python's TypeError before validation)
        with pytest.raises(CoreArgumentError, match="RGLRU: invalid constructor argument") as info2:
            RGLRU(d_model=10, **bad)
        assert field in str(info2.value)


def test_bad_spec_names_the_key_path():
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 8, "depth": 1, "core": {"kind": "rglru", "preset": "tiny", "c": -1.0}}}
    with pytest.raises(SpecError, match="c"):
        build_model(spec)


def test_discrete_time_refuses_sampling_rate_rescaling():
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 8, "depth": 2, "core": {"kind": "rglru", "preset": "tiny"}}}
    model = build_model(spec, seed=0)
    assert "continuous_time" not in type(model.cores()[0]).capabilities
    with pytest.raises(ValueError, match="discrete-time"):
        model.cores()[0].rescale_dt(2.0)
    with pytest.raises(ValueError, match="discrete-time"):
        rescale_sampling_rate(model, 2.0)


def test_backend_labels():
    assert RGLRU(d_model=4, backend="naive").backend_choice.path == "sequential"
    assert RGLRU(d_model=4, backend="scan").backend_choice.label() == "recurrent: scan=scan"
    assert RGLRU(d_model=4).backend_choice.label() == "recurrent: scan=scan"  # pinned on CPU (measured)


def test_a_state_without_its_keys_is_refused_naming_them():
    core = RGLRU(d_model=4)
    state = core.init_state(1)
    del state["start"]
    with pytest.raises(ValueError, match=r"RGLRU state lacks \['start'\].*init_state"):
        core(torch.randn(1, 3, 4), state)
