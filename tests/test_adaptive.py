"""Adaptive depth: the parallel path against a slow reference of the stopping rule, streaming
against the parallel path on every prefix (every streaming core), and counted FLOPs."""

from __future__ import annotations

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.flops import count_flops
from zoo_core.nn.adaptive import AdaptiveConfig, prediction, relative_change
from zoo_core.testing.helpers import cores_with, model_spec

F64 = torch.float64


def spec(task=None, inp=None, **model):
    """``model_spec`` with this file's defaults: depth 4 over period-2 stacking, so recurrence runs."""
    return model_spec(task=task, inp=inp, **{"depth": 4, "stacking": {"policy": "periodic", "period": 2}, **model})


# adaptive ----------------------------------------------------------------------------------------
def reference_adaptive(model, x, lengths, cfg):
    """Slow and obvious: every sample through every depth, then the rule on the whole history."""
    z, n = model.embed(x, lengths)
    outs = [model.readout(z, n)]
    h = z
    every = 1 if cfg.stop_at == "block" else model.stack.period
    for pos in range(cfg.max_depth):
        h = model.stack.run_position(pos, h)
        if (pos + 1) % every == 0:
            outs.append(model.readout(h, n))
    depth, chosen = [], []
    for b in range(x.shape[0]):
        ps = [prediction(o[b : b + 1], model.task, cfg.prediction) for o in outs]
        j = len(ps) - 1
        for k in range(1, len(ps)):
            if k * every >= cfg.min_depth and float(relative_change(ps[k], ps[k - 1])) < cfg.epsilon:
                j = k
                break
        depth.append(j * every)
        chosen.append(outs[j][b])
    return torch.stack(chosen), torch.tensor(depth)


CONFIGS = [  # chosen so that samples stop at different depths (see the assertion on variety)
    dict(epsilon=0.05, max_depth=12, min_depth=1, stop_at="block"),
    dict(epsilon=0.01, max_depth=12, min_depth=2, stop_at="block"),
    dict(epsilon=0.02, max_depth=12, min_depth=3, stop_at="block"),
    dict(epsilon=0.02, max_depth=12, min_depth=6, stop_at="period"),
    dict(epsilon=0.2, max_depth=4, min_depth=1, stop_at="period", prediction="logits"),
    dict(epsilon=1e-9, max_depth=6, min_depth=1, stop_at="block"),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_adaptive_matches_the_reference_rule(cfg):
    model = build_model(spec(), seed=1).double().eval()
    x = torch.randn(6, 10, 3, dtype=F64)
    lengths = torch.tensor([10, 9, 4, 10, 2, 7])
    res = model.adaptive(x, lengths, **cfg, count_flops=False)
    full = AdaptiveConfig(**{"prediction": "probabilities", **cfg})
    with torch.no_grad():
        ref_out, ref_depth = reference_adaptive(model, x, lengths, full)
    assert res.depth.tolist() == ref_depth.tolist()
    torch.testing.assert_close(res.output, ref_out)


def test_the_reference_configs_exercise_different_stopping_depths():
    model = build_model(spec(), seed=1).double().eval()
    x = torch.randn(6, 10, 3, dtype=F64)
    lengths = torch.tensor([10, 9, 4, 10, 2, 7])
    varied = [len(set(model.adaptive(x, lengths, **c, count_flops=False).depth.tolist())) > 1 for c in CONFIGS]
    assert sum(varied) >= 2, varied


def test_adaptive_defaults_come_from_the_spec_and_can_stop_early_or_run_past_the_depth():
    s = spec(stacking={"policy": "periodic", "period": 1, "adaptive": {"epsilon": 10.0, "max_depth": 12, "stop_at": "block"}})
    model = build_model(s, seed=0).eval()
    x = torch.randn(3, 8, 3)
    res = model.adaptive(x)
    assert res.depth.tolist() == [1, 1, 1]  # ε = 10 always holds: stop at the first block
    never = model.adaptive(x, epsilon=1e-12)
    assert never.depth.tolist() == [12, 12, 12]  # past the training depth 4
    assert model.spec["model"]["stacking"]["adaptive"]["max_depth"] == 12


def test_adaptive_at_training_depth_without_stopping_equals_forward():
    model = build_model(spec(), seed=0).double().eval()
    x = torch.randn(3, 8, 3, dtype=F64)
    res = model.adaptive(x, epsilon=1e-300, count_flops=False)
    assert res.depth.tolist() == [4, 4, 4]
    torch.testing.assert_close(res.output, model(x).detach())


def test_counted_flops_scale_with_depth_and_adaptive_saves_them():
    x = torch.randn(4, 16, 3)
    per_depth = []
    for depth in (2, 4, 6):
        model = build_model(spec(depth=depth, stacking={"policy": "periodic", "period": 1}), seed=0).eval()
        with torch.no_grad(), count_flops() as fc:
            model(x)
        per_depth.append(fc.total)
    assert per_depth[0] < per_depth[1] < per_depth[2]
    assert per_depth[2] - per_depth[1] == per_depth[1] - per_depth[0]  # each block costs the same
    model = build_model(spec(depth=6, stacking={"policy": "periodic", "period": 1}), seed=0).eval()
    early = model.adaptive(x, epsilon=10.0, stop_at="block")
    assert early.depth.tolist() == [1] * 4
    assert early.flops_fixed == pytest.approx(per_depth[2] / 4)
    assert float(early.flops.max()) < 0.4 * early.flops_fixed and early.flops_ratio < 0.4
    late = model.adaptive(x, epsilon=1e-12, stop_at="block")
    assert bool((late.flops > late.flops_fixed).all())  # full depth plus the head read at each block


def test_adaptive_flops_are_charged_to_the_samples_that_ran():
    model = build_model(spec(depth=4, stacking={"policy": "periodic", "period": 1}), seed=0).double().eval()
    x = torch.randn(4, 10, 3, dtype=F64)
    with torch.no_grad():
        probe = model.adaptive(x, epsilon=1e-12, stop_at="block", count_flops=False)
    # pick ε between the samples' first relative changes so some stop at 1 and others go on
    with torch.no_grad():
        z, _ = model.embed(x)
        p0 = prediction(model.readout(z), "classification", "probabilities")
        p1 = prediction(model.readout(model.stack.run_position(0, z)), "classification", "probabilities")
        rel = relative_change(p1, p0)
    eps = float(rel.median())
    res = model.adaptive(x, epsilon=eps, stop_at="block")
    assert probe.depth.tolist() == [4] * 4
    stopped = res.depth == 1
    assert 0 < int(stopped.sum()) < 4
    assert float(res.flops[stopped].max()) < float(res.flops[~stopped].min())


@pytest.mark.parametrize("core", cores_with("step"))
def test_adaptive_streaming_equals_parallel_on_every_prefix(core):
    model = build_model(spec(core={"kind": core, "preset": "tiny"}), seed=0).double().eval()
    x = torch.randn(3, 7, 3, dtype=F64)
    for cfg in (dict(epsilon=0.06, stop_at="block"), dict(epsilon=0.02, stop_at="period", min_depth=3)):
        state = model.adaptive_init_state(3, max_depth=8, stop_at=cfg["stop_at"])
        for t in range(x.shape[1]):
            res, state = model.adaptive_step(x[:, t], state, epsilon=cfg["epsilon"], min_depth=cfg.get("min_depth"))
            ref = model.adaptive(x[:, : t + 1], **cfg, max_depth=8, count_flops=False)
            assert res.depth.tolist() == ref.depth.tolist(), (core, t)
            torch.testing.assert_close(res.output, ref.output, rtol=1e-8, atol=1e-10)


def test_adaptive_bad_settings_are_refused():
    model = build_model(spec(), seed=0)
    x = torch.randn(1, 4, 3)
    with pytest.raises(ValueError, match="epsilon"):
        model.adaptive(x, epsilon=0.0)
    with pytest.raises(ValueError, match="min_depth 5 exceeds max_depth 4"):
        model.adaptive(x, min_depth=5, max_depth=4)
    with pytest.raises(ValueError, match="multiple of the period 2"):
        model.adaptive(x, max_depth=5)
    per = build_model(spec(stacking={"policy": "periodic", "period": 2, "norms": "per_position"}), seed=0)
    with pytest.raises(ValueError, match="per_position"):
        per.adaptive(x, max_depth=8)
    seq = build_model(spec(task={"kind": "sequence", "outputs": 2}), seed=0)
    seq.adaptive(x, epsilon=0.1)  # the parallel path serves per-step tasks...
    with pytest.raises(ValueError, match="pooled task"):
        seq.adaptive_init_state(1)  # ...streaming does not


def test_the_flop_count_prices_ops_by_its_table():
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    with count_flops() as fc:
        c = a @ b  # 2·4·8·16
        d = c + 1  # 64 pointwise
        d.sum()  # 64 reduced
        c.view(-1).clone()  # data movement: free
        torch.fft.rfft(torch.randn(3, 64))  # 5·n·log2 n per signal, 3 signals
    assert fc.by_op["mm"] == 1024 and fc.by_op["add"] == 64 and fc.by_op["sum"] == 64
    assert fc.by_op["_fft_r2c"] == 3 * 5 * 64 * 6
    assert fc.total == 1024 + 64 + 64 + 3 * 5 * 64 * 6
    z = torch.randn(4, 8, dtype=torch.complex64)
    with count_flops() as fz:
        z @ z.T.conj()
        z * z
    assert fz.by_op["mm"] == 4 * 2 * 4 * 8 * 4 and fz.by_op["mul"] == 2 * 32
