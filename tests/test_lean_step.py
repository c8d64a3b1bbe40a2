"""The lean streaming step (``zoo_core.nn.lean``) against the general path it stands in for."""

from __future__ import annotations

import glob

import pytest
import torch
from torch import nn

from zoo_core.build import build_model
from zoo_core.export_cli import example_input
from zoo_core.nn.lean import lean_plan

SPECS = sorted(glob.glob("specs/*.yaml") + glob.glob("specs/depth/*.yaml") + glob.glob("specs/paper/*.yaml"))


def _general(model, x_t, state):
    """``model.step`` by the general streaming path (the reference)."""
    outs, new = model._advance(x_t[:, None], state, stepwise=True, reads=[model.stack.depth])
    return model.pool.step_output(outs[0]), new


def _stream(model, x, step):
    state, ys = model.init_state(x.shape[0]), []
    for t in range(x.shape[1]):
        y, state = step(x[:, t], state)
        ys.append(y)
    return torch.stack(ys, 1), state


def _assert_same(a, b, tol=1e-5):
    """Outputs and every state tensor; float32's tolerance allows another summation order (the fused kernel)."""
    (ya, sa), (yb, sb) = a, b
    torch.testing.assert_close(ya, yb, rtol=tol, atol=tol)
    fa, fb = sa.flatten(), sb.flatten()
    assert fa.keys() == fb.keys()
    for k in fa:
        torch.testing.assert_close(fa[k], fb[k], rtol=tol, atol=tol, msg=lambda m, k=k: f"{k}: {m}")


def _streaming_model(path):
    model = build_model(path, seed=0).eval()
    if any(not hasattr(c, "init_state") or "bidirectional" in getattr(c, "capabilities", ()) for c in model.cores()):
        pytest.skip("this model does not stream")
    try:
        model.init_state(1)
    except Exception:  # a core that refuses to stream (an S4 built non-causal, say)
        pytest.skip("this model does not stream")
    return model


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.removeprefix("specs/"))
def test_lean_step_equals_the_general_path(path):
    model = _streaming_model(path)
    x = example_input(model, 2, 12)
    with torch.no_grad():
        plan = lean_plan(model)
        assert (plan is None) == (model.reshaper is not None)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)))


@pytest.mark.parametrize("path", ["specs/s4d-basicmotions.yaml", "specs/s5-basicmotions.yaml", "specs/lru-jv.yaml"])
def test_fused_block_kernel_is_exact_in_float64(path):
    """S4D (per-channel), S5 and LRU (shared decays) blocks run as one fused C++ call; in float64 they
    equal the general path's separate ops to rounding."""
    model = build_model(path, seed=0).double().eval()
    x = example_input(model, 3, 10).double()
    with torch.no_grad():
        plan = lean_plan(model)
        assert plan is not None and all("fused" in p.__name__ for p in plan.positions)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)), tol=1e-11)


def test_lean_step_sees_weights_hooks_modes_and_replaced_modules():
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    x = example_input(model, 2, 6)
    general = lambda xt, s: _general(model, xt, s)  # noqa: E731
    with torch.no_grad():
        plan = lean_plan(model)
        assert plan is not None and lean_plan(model) is plan  # built once
        for p in model.parameters():
            p.mul_(0.9)  # an optimiser's in-place update: read live
        _assert_same(_stream(model, x, model.step), _stream(model, x, general))
        model.head = nn.Linear(model.d_model, 4)  # a replaced module: the plan is rebuilt
        assert lean_plan(model) is not plan
        _assert_same(_stream(model, x, model.step), _stream(model, x, general))
        calls = []
        handle = model.stack.blocks[0].out.register_forward_hook(lambda *a: calls.append(1))
        assert lean_plan(model) is None  # a hook must run: the general path runs it
        model.step(x[:, 0], model.init_state(2))
        assert calls
        handle.remove()
        model.stack.blocks[1].drop.train()  # part of the model training: dropout must draw
        assert lean_plan(model) is None
        model.eval()
    with torch.inference_mode():
        _assert_same(_stream(model, x, model.step), _stream(model, x, general))
    # gradients on: the general path (backpropagation through the step)
    y, _ = model.step(x[:, 0], model.init_state(2))
    assert y.requires_grad

