"""The lean streaming step (``zoo_core.nn.lean``) against the general path it stands in for."""

from __future__ import annotations

import copy
import glob
import logging

import pytest
import torch
from torch import nn

from zoo_core.build import build_model
from zoo_core.export_cli import example_input
from zoo_core.nn import lean
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


FUSED = ["specs/s4d-basicmotions.yaml", "specs/s5-basicmotions.yaml", "specs/lru-jv.yaml", "specs/s4-basicmotions.yaml",
         "specs/linoss-basicmotions.yaml", "pretrained/specs/mamba-small.japanesevowels.yaml"]
# MambaSL's switches (fixed Δ, B or C; no D) and the biases mamba_ssm leaves off: each absent or present part
MAMBA_VARIANTS = [{"tv_dt": False}, {"tv_B": False, "use_D": False}, {"tv_C": False, "bias": True, "conv_bias": False},
                  {"tv_dt": False, "tv_B": False, "tv_C": False, "d_conv": 1}]


def _mamba_variant(patch):
    import yaml

    spec = yaml.safe_load(open("pretrained/specs/mamba-small.japanesevowels.yaml"))
    spec["model"]["core"].update(patch)
    return build_model(spec, seed=0)


@pytest.fixture(params=["program", "plan"])
def whole(request, monkeypatch):
    """Each case twice: with the whole-step program where the model has one, and with the plan alone (each
    block one fused call), so the per-block kernel stays held to the general path too."""
    if request.param == "plan":
        monkeypatch.setattr(lean, "_program", lambda *a: None)
    return request.param == "program"


def _no_program(monkeypatch):
    monkeypatch.setattr(lean, "_program", lambda *a: None)


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
def test_lean_step_equals_the_general_path(path, whole):
    model = _streaming_model(path)
    x = example_input(model, 2, 12)
    with torch.no_grad():
        plan = lean_plan(model)
        assert (plan is None) == (model.reshaper is not None)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)))


@pytest.mark.parametrize("path", FUSED)
def test_fused_block_kernel_is_exact_in_float64(path, whole):
    """S4D (per-channel decays), S5 and LRU (shared), S4 (DPLR), LinOSS (oscillator blocks) and Mamba (the
    selective mixer) run each block as one fused C++ call, and the whole step as one program call; in
    float64 both equal the general path's separate ops to rounding."""
    model = build_model(path, seed=0).double().eval()
    x = example_input(model, 3, 10).double()
    with torch.no_grad():
        plan = lean_plan(model)
        assert plan is not None and all("fused" in p.__name__ for p in plan.positions)
        assert bool(lean.program_of(model)) == whole
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)), tol=1e-11)


@pytest.mark.parametrize("patch", MAMBA_VARIANTS, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_every_mamba_variant_fuses_exactly(patch, whole):
    model = _mamba_variant(patch).double().eval()
    x = example_input(model, 3, 10).double()
    with torch.no_grad():
        plan = lean_plan(model)
        assert plan is not None and all("fused" in p.__name__ for p in plan.positions)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)), tol=1e-11)


def test_a_half_precision_mamba_is_not_fused():
    """A bfloat16 Mamba keeps A_log and D in float32: the kernel (one dtype) does not take it, the plan's
    separate ops do (equal to the general path to bfloat16 rounding), and no program was built for it."""
    model = build_model("pretrained/specs/mamba-small.japanesevowels.yaml", seed=0, dtype=torch.bfloat16).eval()
    x = example_input(model, 2, 4).to(torch.bfloat16)
    with torch.no_grad():
        plan = lean_plan(model)
        assert not any("fused" in p.__name__ for p in plan.positions) and not lean.program_of(model)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)), tol=2e-2)


@pytest.mark.parametrize("path", [*FUSED, "specs/s4d-lm.yaml", "specs/s4d-sequence.yaml", "specs/lru-shared-aaaaaa.yaml",
                                  "pretrained/specs/s4d-small.listops.yaml", "pretrained/specs/mamba-char.shakespeare.yaml"])
def test_the_whole_step_is_one_program_call(path, monkeypatch):
    """Models made of the fused kernel's parts (a linear or embedding encoder, per-step and pooled readouts,
    blocks shared across depth) step without the plan: one ``StepProgram`` call a token, built once."""
    model = _streaming_model(path)
    x = example_input(model, 2, 8)
    with torch.no_grad():
        model.step(x[:, 0], model.init_state(2))  # builds the plan and the program
        program = lean.program_of(model)
        monkeypatch.setattr(lean.LeanStep, "step", lambda *a: pytest.fail("the plan ran"))
        got = _stream(model, x, model.step)
        assert lean.program_of(model) is program  # never rebuilt: nothing it watches changed
        monkeypatch.undo()
        _assert_same(got, _stream(model, x, lambda xt, s: _general(model, xt, s)))


def test_the_program_sees_every_change_it_was_built_from():
    """Whatever the program baked in, changed after it was built, is seen at the next step: an in-place
    update, a setting, an activation's form, a step size, a reassigned parameter or its ``.data``, the
    stack's damping, a replaced module, a block's norm statistics in place."""
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    x = example_input(model, 2, 6)
    blocks = model.stack.blocks
    changes = {
        "in place": lambda: [p.mul_(0.9) for p in model.parameters()],
        "a setting": lambda: setattr(blocks[0], "prenorm", False),
        "an activation's form": lambda: setattr(blocks[1].act, "approximate", "tanh"),
        "a step size": lambda: blocks[2].core.rescale_dt(2.0),
        "a reassigned parameter": lambda: setattr(model.head, "weight", nn.Parameter(torch.randn_like(model.head.weight))),
        "a parameter's .data": lambda: setattr(blocks[3].norm.weight, "data", torch.randn(model.d_model)),
        "the damping": lambda: setattr(model.stack, "alpha_fixed", 0.5),
        "a replaced module": lambda: setattr(blocks[0], "act", nn.SiLU().eval()),
        "an eps": lambda: setattr(blocks[2].norm, "eps", 0.5),
    }
    with torch.no_grad():
        model.step(x[:, 0], model.init_state(2))
        for what, change in changes.items():
            program = lean.program_of(model)
            before = _stream(model, x, model.step)
            change()
            got = _stream(model, x, model.step)
            assert lean.program_of(model) is not program, what
            _assert_same(got, _stream(model, x, lambda xt, s: _general(model, xt, s)))
            assert not torch.allclose(got[0], before[0]), what  # the change mattered


def test_the_program_sees_edits_past_the_version_counter():
    """Edits an in-place version does not count: a learned damping changed through ``.data`` (read at each
    call), a weight's ``.data`` given another layout or size, a parameter swapped in place
    (``torch.utils.swap_tensors``, which ``load_state_dict`` uses under the swap future: holding a
    parameter must not make it refuse)."""
    model = build_model("specs/depth/lru-motor-aaaaaa-learned-damping.yaml", seed=0).eval()
    x = example_input(model, 2, 5)
    general = lambda xt, s: _general(model, xt, s)  # noqa: E731
    with torch.no_grad():
        model.step(x[:, 0], model.init_state(2))
        assert lean.program_of(model)
        model.stack.damping_logit.data.fill_(-3.0)  # no version bump
        _assert_same(_stream(model, x, model.step), _stream(model, x, general))
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    other = build_model("specs/s4d-basicmotions.yaml", seed=1).eval()
    x = example_input(model, 2, 5)
    with torch.no_grad():
        model.step(x[:, 0], model.init_state(2))
        out = model.stack.blocks[0].out[0]
        out.weight.data = out.weight.data.t().contiguous().t()  # same values, another layout (strided)
        _assert_same(_stream(model, x, model.step), _stream(model, x, general))
        model.head.weight.data, model.head.bias.data = model.head.weight.data[:2], model.head.bias.data[:2]
        got = _stream(model, x, model.step)
        assert got[0].shape[-1] == 2
        _assert_same(got, _stream(model, x, general))
        model.head = nn.Linear(model.d_model, 4).eval()
        model.step(x[:, 0], model.init_state(2))
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            model.load_state_dict(other.state_dict())
            model.double()
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
        x = x.double()
        _assert_same(_stream(model, x, model.step), _stream(model, x, general))


def test_the_program_keeps_no_model_alive_and_takes_odd_buffers():
    """A hook that refers to the model does not keep it alive through the program (it holds modules
    weakly); a buffer with no storage (sparse) is watched without one; a large head is the program's too
    (its product splits over threads, as fast as BLAS at one row), and a batch of them past ``max_rows``
    goes to the plan's BLAS product."""
    import gc
    import weakref

    model = build_model("specs/lru-jv.yaml", seed=0).eval()
    x = example_input(model, 1, 2)
    with torch.no_grad():
        model.step(x[:, 0], model.init_state(1))
    model.stack.blocks[0].register_forward_hook(lambda m, i, o, model=model: None)
    model.register_forward_hook(lambda m, i, o, model=model: None)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    model = build_model("specs/lru-jv.yaml", seed=0).eval()
    model.register_buffer("extra", torch.eye(3).to_sparse(), persistent=False)
    with torch.no_grad():
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)))
        assert lean.program_of(model)
    model = build_model("specs/s4d-lm.yaml", seed=0).eval()
    model.head = nn.Linear(model.d_model, 70_000).eval()
    tokens = torch.tensor([[1, 2]])
    with torch.no_grad():
        _assert_same(_stream(model, tokens, model.step), _stream(model, tokens, lambda xt, s: _general(model, xt, s)))
        program = lean.program_of(model)
        assert program and program.calls == 1  # the first step built it, the second ran it
        rows = lean.max_rows(model.head.weight.numel()) + 1
        assert rows == lean._ROWS_ALWAYS + 1
        assert program.run(tokens[:, 0].expand(rows), model.init_state(rows)) == 0  # DECLINED


@pytest.mark.parametrize("path", FUSED)
def test_a_row_steps_to_the_bit_alone_or_in_a_batch(path):
    """The program reads each weight row once for the whole batch (and may split the rows over threads), but
    every row's sums are the ones it computes for that row alone: a stream's output and state do not depend
    on what else is in its batch. (BLAS, the plan's encoder and head, gives no such promise.)"""
    model = build_model(path, seed=0).eval()
    x = example_input(model, 5, 6)
    with torch.no_grad():
        model.step(x[:, 0], model.init_state(5))  # builds the program (this first step ran the plan)
        ys, state = _stream(model, x, model.step)
        assert lean.program_of(model)
        for r in range(5):
            y1, state1 = _stream(model, x[r:r + 1], model.step)
            assert torch.equal(y1, ys[r:r + 1])
            for k, t in state1.flatten().items():
                assert torch.equal(t, state.flatten()[k][r:r + 1]), k


def test_a_batch_past_the_kernels_reach_takes_blas():
    """Past ``max_rows`` (16 rows, or more while rows × the largest matrix's weights stay within
    ``_ROWS_X_WEIGHTS``), where BLAS's blocked products win, the program declines and each block takes its
    separate ops, equal to the general path."""
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    rows = lean.max_rows(2 * model.d_model * model.d_model) + 1  # the GLU map's (2H, H) weight is the largest
    assert rows == lean._ROWS_X_WEIGHTS // (2 * model.d_model * model.d_model) + 1 > lean._ROWS_ALWAYS
    x = example_input(model, rows, 3)
    with torch.no_grad():
        model.step(x[:1, 0], model.init_state(1))
        assert lean.program_of(model).run(x[:, 0], model.init_state(rows)) == 0  # DECLINED
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)))
        assert lean.program_of(model).run(x[:-1, 0], model.init_state(rows - 1)).__class__ is tuple


def test_weights_changing_at_every_step_stop_the_program(caplog):
    """Online updates between steps make every program stale within a call: after a few, the model keeps
    the plan (one fused call per block) rather than rebuilding a program each token, and says so once."""
    model = build_model("specs/lru-jv.yaml", seed=0).eval()
    x = example_input(model, 2, 12)
    general = lambda xt, s: _general(model, xt, s)  # noqa: E731
    with caplog.at_level(logging.INFO, logger="zoo_core.nn.lean"), torch.no_grad():
        state, ref_state = model.init_state(2), model.init_state(2)
        for t in range(x.shape[1]):
            y, state = model.step(x[:, t], state)
            y_ref, ref_state = general(x[:, t], ref_state)
            torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
            model.head.bias.add_(0.01)  # an update between steps
    assert lean.program_of(model) is False
    assert sum("stops building its whole-step program" in r.getMessage() for r in caplog.records) == 1


def test_the_program_declines_what_it_does_not_take():
    """A token out of range raises the general path's error; a state in another dtype, a float64 input
    to a float32 model and a non-contiguous state take the plan, equal to the general path."""
    model = build_model("specs/s4d-lm.yaml", seed=0).eval()
    with torch.no_grad():
        state = model.init_state(1)
        model.step(torch.tensor([1]), state)
        vocab = model.encoder.num_embeddings
        with pytest.raises(IndexError):
            model.step(torch.tensor([vocab]), state)
    model = build_model("specs/s5-basicmotions.yaml", seed=0).eval()
    x = example_input(model, 2, 3)
    with torch.no_grad():
        state = model.init_state(2)
        y, new = model.step(x[:, 0], state)
        program = lean.program_of(model)
        assert program.run(x[:, 0].double(), state) == 0  # DECLINED: another dtype
        strided = type(state)(state.t, [{"h": torch.stack([h["h"]] * 2, -1)[..., 0]} for h in state.layers], state.pools)
        assert program.run(x[:, 0], strided) == 0  # DECLINED: a state not laid out as its own
        _assert_same(model.step(x[:, 0], strided), _general(model, x[:, 0], state))
        assert lean.program_of(model) is program
    with torch.inference_mode():  # weights made as inference tensors have no version counter to watch
        model = build_model("specs/lru-jv.yaml", seed=0).eval()
        x = example_input(model, 2, 4)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)))
        assert lean.program_of(model).run(x[:, 0], model.init_state(2)) == 0  # a watcher: declines every call


def test_a_model_the_program_does_not_take_is_said_once(caplog):
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    model.head = nn.Sequential(nn.Linear(model.d_model, 4))
    model.eval()
    x = example_input(model, 1, 3)
    with caplog.at_level(logging.INFO, logger="zoo_core.nn.lean"), torch.no_grad():
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)))
    said = [r.getMessage() for r in caplog.records if "whole-step program does not take" in r.getMessage()]
    assert len(said) == 1 and "the head Sequential" in said[0]


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



def test_without_the_kernel_blocks_run_as_separate_ops_and_say_so_once(monkeypatch, caplog):
    from zoo_core.kernels import cpp

    monkeypatch.setattr(cpp, "unavailable_reason", lambda name: "no C++ compiler: 'c++' is not on PATH")
    model = build_model("specs/lru-jv.yaml", seed=0).eval()
    x = example_input(model, 2, 5)
    with caplog.at_level(logging.WARNING, logger="zoo_core.nn.lean"), torch.no_grad():
        plan = lean_plan(model)
        assert plan is not None and not any("fused" in p.__name__ for p in plan.positions)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)))
    said = [r.getMessage() for r in caplog.records if "fused C++ block kernel is unavailable" in r.getMessage()]
    assert len(said) == 1 and "not on PATH" in said[0]


def test_fused_kernel_checks_its_input():
    from zoo_core.kernels import cpp

    kernel = cpp.load("stream_block")
    x, h = torch.randn(2, 4), torch.zeros(2, 4, 3, dtype=torch.complex64)
    a = b = c = torch.randn(4, 3, 2)
    common = (1, None, None, None, None, 1e-5, True, 1, 0, None, None, True)
    z, new = kernel.diag_block(x, h, a, b, c, torch.randn(4), True, *common)
    assert z.shape == (2, 4) and new.dtype == torch.complex64 and new.shape == h.shape
    with pytest.raises(RuntimeError, match="per-channel b, c must be"):
        kernel.diag_block(x, h, a, torch.randn(4, 2, 2), c, torch.randn(4), True, *common)
    with pytest.raises(RuntimeError, match="dtype"):
        kernel.diag_block(x.double(), h, a, b, c, torch.randn(4), True, *common)
    with pytest.raises(RuntimeError, match="output map's weight"):
        kernel.diag_block(x, h, a, b, c, torch.randn(4), True, *common[:8], 2, torch.randn(4, 4), None, True)


def test_a_state_the_kernel_does_not_take_goes_to_the_separate_ops():
    """A state of another precision (complex128 for a float32 model) is stepped by the ops, not the kernel."""
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    x = example_input(model, 1, 3)
    with torch.no_grad():
        state = model.init_state(1)
        wide = type(state)(state.t, [{"h": s["h"].to(torch.complex128)} for s in state.layers], state.pools)
        y, new = model.step(x[:, 0], wide)
        y_ref, _ = _general(model, x[:, 0], wide)
    torch.testing.assert_close(y, y_ref)


def test_a_deep_copy_streams_its_own_weights():
    """The plan lives beside the model, not in it: a copy made after streaming (a best-model snapshot,
    an EMA or SWA copy) builds its own plan over its own modules."""
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    x = example_input(model, 2, 4)
    with torch.no_grad():
        _stream(model, x, model.step)  # the original's plan is built
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.mul_(0.5)
        _assert_same(_stream(twin, x, twin.step), _stream(twin, x, lambda xt, s: _general(twin, xt, s)))


def test_a_plan_does_not_keep_its_model_alive():
    import gc
    import weakref

    model = build_model("specs/lru-jv.yaml", seed=0).eval()
    with torch.no_grad():
        model.step(example_input(model, 1, 1)[:, 0], model.init_state(1))
    assert lean.plan_of(model) is not None and lean.program_of(model)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


def test_a_core_overriding_step_alone_keeps_its_step():
    """A subclass that overrides ``step`` but not ``stream`` (S5's bidirectional variant refuses to step)
    is stepped through its ``step``, never fused from the inherited ``stream()``."""
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    core = model.stack.blocks[0].core
    calls = []

    class Counting(type(core)):
        def step(self, x_t, state):
            calls.append(1)
            return super().step(x_t, state)

    core.__class__ = Counting
    with torch.no_grad():
        model.step(example_input(model, 1, 1)[:, 0], model.init_state(1))
        plan = lean_plan(model)
    assert calls and "fused" not in plan.positions[0].__name__ and "fused" in plan.positions[1].__name__


def test_rmsnorm_without_eps_takes_the_input_dtypes_epsilon():
    model = build_model("specs/s4d-basicmotions.yaml", seed=0).double().eval()
    for block in model.stack.blocks:
        block.norm = nn.RMSNorm(model.d_model, eps=None, dtype=torch.float64)
    model.eval()  # the new norms too (a module in training mode makes the plan step aside)
    x = 1e-5 * example_input(model, 2, 6).double()  # small inputs: the epsilon matters
    with torch.no_grad():
        assert all("fused" in p.__name__ for p in lean_plan(model).positions)
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda xt, s: _general(model, xt, s)), tol=1e-11)


def test_dispatch_modes_and_autocast_see_the_general_path():
    """A dispatch mode (FLOP counting, fake tensors) must see every op, and autocast's casts are the
    general path's: under either, ``step`` is the general path exactly."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    model = build_model("specs/s4d-basicmotions.yaml", seed=0).eval()
    x, state = example_input(model, 1, 1)[:, 0], model.init_state(1)
    with torch.no_grad():
        with Ops() as ops:
            model.step(x, state)
        assert ops.seen.count("aten.native_layer_norm.default") == 4  # each block's norm, none hidden in a kernel
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, _ = model.step(x, state)
            y_ref, _ = _general(model, x, state)
    assert torch.equal(y, y_ref)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.removeprefix("specs/"))
def test_export_traces_the_plan_as_separate_ops(path, monkeypatch):
    """``torch.export`` of a model's step (what ``zoo export --mode stream`` runs) traces the lean plan with
    every block as separate ops (the fused kernel is opaque to export), not the general path: fewer nodes
    for an edge runtime. Its program equals the eager step (a damped stack's damping once, as the kernel's)."""
    from zoo_core.export import StepModule

    model = _streaming_model(path)
    state = model.init_state(2)
    if state.reshape is not None or model.reshaper is not None:
        pytest.skip("raw steps are buffered into model steps (input reshaping): the general path, not the plan")
    calls = []
    monkeypatch.setattr(lean.LeanStep, "step", lambda self, *a, _step=lean.LeanStep.step: calls.append(1) or _step(self, *a))
    x = example_input(model, 2, 3)
    with torch.no_grad():
        state = model.step(x[:, 0], state)[1]  # fills the cached constants, as zoo export does
        wrapper = StepModule(model, state, real=True)
        calls.clear()
        program = torch.export.export(wrapper, (x[:, 1].clone(), *(t.clone() for t in wrapper.flatten(state))))
        assert calls, "the export traced the general path"
        got = program.module()(x[:, 1], *wrapper.flatten(state))
        y, new = model.step(x[:, 1], state)
    torch.testing.assert_close(got[0], y, rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1:], wrapper.flatten(new), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_declined_kernel_damps_once(monkeypatch):
    """Where the fused kernel declines a call, the block's separate ops stand in for the kernel's undamped output
    and the stack's damping is applied once (it was applied twice)."""
    _no_program(monkeypatch)  # the plan's blocks are what this holds to account
    model = _streaming_model("specs/depth/lru-motor-aaaaaa-damped.yaml")
    x = example_input(model, 2, 6)
    with torch.no_grad():
        plan = lean.lean_plan(model)
        assert plan is not None
        if not any(p.__name__ == "fused_residual_block" for p in plan.positions):
            pytest.skip(f"no fused kernel to decline here: {lean.cpp.unavailable_reason(lean.KERNEL)}")
        monkeypatch.setattr(lean, "_core_args", lambda s: None)  # every call declined, after the plan was built
        _assert_same(_stream(model, x, model.step), _stream(model, x, lambda x_t, s: _general(model, x_t, s)))
