"""Depth recurrence: padding-aware pooling, per-period outputs, damping, per-position norms,
adaptive depth (parallel and streaming) and counted FLOPs, for every registered core."""

from __future__ import annotations

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.nn.blocks import count_params
from zoo_core.testing.helpers import cores_with, model_spec, unroll

F64 = torch.float64


def spec(task=None, inp=None, **model):
    """``model_spec`` with this file's defaults: depth 4 over period-2 stacking, so recurrence runs."""
    return model_spec(task=task, inp=inp, **{"depth": 4, "stacking": {"policy": "periodic", "period": 2}, **model})


# lengths -----------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", ["mean", "last", "mean_logits"])
def test_padded_steps_never_reach_the_pool(pool):
    model = build_model(spec(pool=pool, head={"kind": "mlp"}), seed=0).double().eval()
    x = torch.randn(3, 12, 3, dtype=F64)
    lengths = torch.tensor([12, 7, 1])
    with torch.no_grad():
        y = model(x, lengths)
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(y[i], model(x[i : i + 1, :n])[0], rtol=1e-10, atol=1e-12)
        noisy = x.clone()
        noisy[1, 7:] = 1e3  # garbage in the padding changes nothing
        torch.testing.assert_close(model(noisy, lengths), y, rtol=1e-10, atol=1e-12)
        assert not torch.allclose(model(noisy), model(x))  # ...while unmasked it would


def test_bad_lengths_are_refused():
    model = build_model(spec(), seed=0)
    x = torch.randn(2, 5, 3)
    for bad in (torch.tensor([5, 0]), torch.tensor([6, 2]), torch.tensor([3]), torch.tensor([2.0, 3.0])):
        with pytest.raises(ValueError, match="lengths"):
            model(x, bad)


def test_mean_logits_differs_from_mean_with_a_nonlinear_head():
    a = build_model(spec(pool="mean", head={"kind": "mlp"}), seed=0).double().eval()
    b = build_model(spec(pool="mean_logits", head={"kind": "mlp"}), seed=0).double().eval()
    x = torch.randn(2, 9, 3, dtype=F64)
    with torch.no_grad():
        h = a.features(x)
        torch.testing.assert_close(b(x), a.head(h).mean(1))
        torch.testing.assert_close(a(x), a.head(h.mean(1)))
        assert not torch.allclose(a(x), b(x))


# per-period outputs --------------------------------------------------------------------------
@pytest.mark.parametrize("period,depth", [(1, 4), (2, 4), (4, 4), (3, 6)])
def test_period_outputs_read_the_shared_head_after_each_period(period, depth):
    policy = {"policy": "independent"} if period == depth else {"policy": "periodic", "period": period}
    model = build_model(spec(depth=depth, stacking=policy), seed=0).double().eval()
    x = torch.randn(2, 8, 3, dtype=F64)
    lengths = torch.tensor([8, 5])
    with torch.no_grad():
        outs = model.period_outputs(x, lengths)
        assert len(outs) == depth // period
        torch.testing.assert_close(outs[-1], model(x, lengths), rtol=0, atol=0)
        h = model.encoder(x)  # the slow reference: the blocks by hand
        for j in range(depth // period):
            for pos in range(j * period, (j + 1) * period):
                h = model.stack.blocks[model.stack.schedule[pos]](h)
            torch.testing.assert_close(outs[j], model.readout(h, lengths))


def test_period_outputs_carry_gradients_to_shared_blocks():
    model = build_model(spec(), seed=0)
    outs = model.period_outputs(torch.randn(2, 6, 3))
    loss = sum(torch.nn.functional.cross_entropy(o, torch.tensor([0, 2])) for o in outs) / len(outs)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


# damping -------------------------------------------------------------------------------------
def test_damping_is_krasnoselskii_mann():
    plain = build_model(spec(block={"dropout": 0.0}), seed=0).double().eval()
    damped = build_model(spec(stacking={"policy": "periodic", "period": 2, "damping": 0.25}), seed=0).double().eval()
    damped.load_state_dict(plain.state_dict())
    x = torch.randn(2, 7, 3, dtype=F64)
    with torch.no_grad():
        h = plain.encoder(x)
        for pos in range(4):
            h = 0.75 * h + 0.25 * plain.stack.blocks[pos % 2](h)
        torch.testing.assert_close(damped.features(x), h)
        assert not torch.allclose(plain.features(x), h)


def test_learned_damping_is_a_sigmoid_per_unique_block_starting_at_its_init():
    model = build_model(spec(stacking={"policy": "periodic", "period": 2, "damping": "learned", "damping_init": 0.6}), seed=0)
    logit = model.stack.damping_logit
    assert logit.shape == (2,)
    torch.testing.assert_close(torch.sigmoid(logit), torch.full((2,), 0.6))
    model(torch.randn(2, 5, 3)).sum().backward()
    assert logit.grad is not None and bool((logit.grad != 0).all())
    default = build_model(spec(stacking={"policy": "periodic", "period": 1, "damping": "learned"}), seed=0)
    torch.testing.assert_close(torch.sigmoid(default.stack.damping_logit), torch.full((1,), 0.9))
    assert count_params(default) == count_params(build_model(spec(stacking={"policy": "periodic", "period": 1}), seed=0)) + 1


def test_module_apply_reaches_every_module_through_the_stack():
    """``model.apply(init_fn)`` is ``nn.Module.apply``: the stack's depth-position method must not
    shadow it (it was ``Stack.apply(pos, h)``, so ``apply(fn)`` on a model raised instead)."""
    model = build_model(spec(), seed=0)
    seen: list[torch.nn.Module] = []
    assert model.apply(seen.append) is model
    assert len(seen) == len(list(model.modules())) and {id(m) for m in seen} == {id(m) for m in model.modules()}
    assert model.stack.apply(seen.append) is model.stack


@pytest.mark.parametrize("core", cores_with("step"))
def test_step_equals_forward_with_damping_and_sharing_for_every_core(core):
    stackings = [{"policy": "periodic", "period": 1, "damping": 0.5},
                 {"policy": "periodic", "period": 2, "damping": "learned", "norms": "per_position"}]
    for stacking in stackings:
        model = build_model(spec(core={"kind": core, "preset": "tiny"}, stacking=stacking, block={"norm": "layer"}), seed=0).double().eval()
        x = torch.randn(2, 9, 3, dtype=F64)
        with torch.no_grad():
            torch.testing.assert_close(unroll(model, x)[-1], model(x), rtol=1e-8, atol=1e-10)
            _, st = model.forward_with_state(x[:, :4])
            for t in range(4, 9):
                y, st = model.step(x[:, t], st)
            torch.testing.assert_close(y, model(x), rtol=1e-8, atol=1e-10)


# norms -----------------------------------------------------------------------------------------
def test_per_position_norms_are_separate_and_default_is_shared():
    shared = build_model(spec(stacking={"policy": "periodic", "period": 1}, block={"norm": "layer"}), seed=0)
    per = build_model(spec(stacking={"policy": "periodic", "period": 1, "norms": "per_position"}, block={"norm": "layer"}), seed=0)
    assert shared.spec["model"]["stacking"]["norms"] == "shared" and shared.stack.position_norms is None
    assert len(per.stack.position_norms) == 4 and per.stack.blocks[0].norm is None
    assert count_params(per) == count_params(shared) + 3 * 2 * 6  # three more affine LayerNorms of width 6
    with torch.no_grad():  # distinct norms: changing one position's changes the output
        x = torch.randn(1, 5, 3)
        before = per(x)
        per.stack.position_norms[2][0].weight.mul_(3)
        assert not torch.allclose(before, per(x))


def test_per_position_batch_norms_keep_their_own_statistics():
    model = build_model(spec(stacking={"policy": "periodic", "period": 1, "norms": "per_position"}, block={"norm": "batch"}), seed=0)
    model.train()
    model(torch.randn(4, 6, 3) * 5)
    means = [n[0].bn.running_mean.clone() for n in model.stack.position_norms]
    assert not torch.allclose(means[0], means[3])


def test_dropout_draws_a_fresh_mask_at_each_application():
    model = build_model(spec(stacking={"policy": "periodic", "period": 1}, block={"dropout": 0.5, "norm": "none"}), seed=0)
    seen = []
    model.stack.blocks[0].drop.register_forward_hook(lambda m, i, o: seen.append((o == 0)))
    model.train()
    torch.manual_seed(0)
    model(torch.randn(2, 5, 3))
    masks = seen[0::2]  # the first dropout of each application (each block calls drop twice)
    assert len(masks) == 4 and not all(torch.equal(masks[0], m) for m in masks[1:])


def test_batch_norm_shared_across_depth_warns(caplog):
    """One BatchNorm reused at several depth positions evaluates with averaged statistics: warned."""
    import logging

    from zoo_core.build import build_model


    def spec(norm, norms="shared"):
        return {"schema_version": 1, "task": {"kind": "classification", "classes": 2}, "input": {"channels": 3},
                "model": {"d_model": 8, "depth": 2, "block": {"norm": norm},
                          "stacking": {"policy": "periodic", "period": 1, "norms": norms},
                          "core": {"kind": "lru", "preset": "tiny"}}}

    with caplog.at_level(logging.WARNING, logger="zoo_core.build"):
        build_model(spec("batch"))
    assert "ema_batch" in caplog.text and "per_position" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zoo_core.build"):
        build_model(spec("ema_batch"))
        build_model(spec("batch", "per_position"))
    assert caplog.text == ""
