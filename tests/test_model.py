"""Whole models: every task streams through step exactly as it runs in parallel; sharing across
depth reuses blocks; Δ rescaling runs the same weights at half the sampling rate."""

from __future__ import annotations

import copy

import pytest
import torch

from zoo_core.build import build_model, summary
from zoo_core.factory import load_pretrained
from zoo_core.io.pretrained import save_pretrained
from zoo_core.nn.blocks import count_params
from zoo_core.nn.model import rescale_sampling_rate
from zoo_core.testing.helpers import model_spec


def spec(task, inp, **model):
    """``model_spec`` around S4D's tiny preset with this file's sizes (d_model 8, depth 3)."""
    return model_spec(task=task, inp=inp, **{"core": "s4d", "d_model": 8, "depth": 3, **model})


CASES = {
    "classification-mean": spec({"kind": "classification", "classes": 3}, {"channels": 2}),
    "classification-last-postnorm": spec({"kind": "classification", "classes": 3}, {"channels": 2}, pool="last", block={"norm": "batch", "prenorm": False}),
    "regression-rms-linear": spec({"kind": "regression", "outputs": 2}, {"channels": 4}, block={"norm": "rms", "output": "linear", "activation": "silu"}),
    "sequence-noresidual": spec({"kind": "sequence", "outputs": 5}, {"channels": 3}, block={"residual": False, "output": "none", "norm": "none"}),
    "lm-tied": spec({"kind": "lm"}, {"vocab_size": 11}, final_norm="rms", tie_embeddings=True),
    "periodic-abab": spec({"kind": "sequence", "outputs": 2}, {"channels": 2}, depth=6, stacking={"policy": "periodic", "period": 2}),
    "recurrent-backend": spec({"kind": "sequence", "outputs": 2}, {"channels": 2}, core={"kind": "s4d", "preset": "tiny", "backend": "scan"}),
    "lrcssm-backbone": spec({"kind": "classification", "classes": 3}, {"channels": 2}, block={"preset": "lrcssm"},
                            encoder={"kind": "mlp"}, head={"kind": "mlp"}, pool="mean_logits"),
    "lrcssm-backbone-sequence": spec({"kind": "sequence", "outputs": 2}, {"channels": 2}, block={"preset": "lrcssm"},
                                     core={"kind": "lru", "preset": "tiny"}, stacking={"policy": "periodic", "period": 1, "damping": 0.5}),
}


def _inputs(model, B, L):
    if model.task == "lm":
        return torch.randint(0, 11, (B, L))
    enc = model.encoder if isinstance(model.encoder, torch.nn.Linear) else model.encoder[0]
    return torch.randn(B, L, enc.in_features, dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_equals_forward(name):
    model = build_model(CASES[name], seed=0).double().eval()
    x = _inputs(model, 2, 19)
    with torch.no_grad():
        full = model(x)
        state = model.init_state(2)
        outs = []
        for t in range(x.shape[1]):
            y, state = model.step(x[:, t], state)
            outs.append(y)
        streamed = torch.stack(outs, 1) if model.pool.per_step else outs[-1]
        torch.testing.assert_close(streamed, full, rtol=1e-9, atol=1e-9)
        # chunked streaming: prefill half with forward_with_state, step through the rest
        y1, st = model.forward_with_state(x[:, :10])
        for t in range(10, x.shape[1]):
            y_t, st = model.step(x[:, t], st)
        torch.testing.assert_close(y_t, full[:, -1] if model.pool.per_step else full, rtol=1e-9, atol=1e-9)


def test_periodic_sharing_reuses_blocks_and_counts_once():
    indep = build_model(spec({"kind": "regression", "outputs": 1}, {"channels": 3}, depth=6), seed=0)
    shared = {m: build_model(spec({"kind": "regression", "outputs": 1}, {"channels": 3}, depth=6, stacking={"policy": "periodic", "period": m}), seed=0) for m in (1, 2, 3)}
    block = count_params(indep.stack.blocks[0])
    other = count_params(indep) - 6 * block
    for m, model in shared.items():
        assert len(model.stack.blocks) == m
        assert count_params(model) == other + m * block
        assert model.stack.schedule == [i % m for i in range(6)]
    assert "schedule ABCABC" in summary(shared[3]) and "schedule AAAAAA" in summary(shared[1])


def test_tied_lm_head_shares_the_embedding():
    model = build_model(CASES["lm-tied"], seed=0)
    assert model.head.weight is model.encoder.weight
    assert "tied to the embedding" in summary(model)


def test_rescale_half_rate_is_exact_for_zoh_on_held_samples():
    """ZOH with a piecewise-constant input: two steps of Δ equal one step of 2Δ exactly, so the
    model run on every other sample with Δ doubled reproduces the full-rate outputs."""
    s = spec({"kind": "sequence", "outputs": 2}, {"channels": 2}, depth=2, block={"norm": "none"})
    full = build_model(s, seed=0).double().eval()
    half = rescale_sampling_rate(copy.deepcopy(full), 2.0)
    assert half.spec["model"]["core"]["dt_scale"] == 2.0 and full.spec["model"]["core"]["dt_scale"] == 1.0
    v = torch.randn(1, 20, 2, dtype=torch.float64)
    u = v.repeat_interleave(2, dim=1)  # (1, 40, 2): each sample held for two steps
    with torch.no_grad():
        y_full = full.stack.blocks[0].core(full.encoder(u))[:, 1::2]
        y_half = half.stack.blocks[0].core(half.encoder(v))
    torch.testing.assert_close(y_half, y_full, rtol=1e-10, atol=1e-10)


def test_rescale_changes_outputs_and_rejects_bad_factor():
    model = build_model(CASES["classification-mean"], seed=0).eval()
    x = torch.randn(1, 30, 2)
    before = model(x)
    rescale_sampling_rate(model, 2.0)
    assert not torch.allclose(before, model(x))
    with pytest.raises(ValueError):
        rescale_sampling_rate(model, 0.0)


def test_rescale_refuses_discrete_time_cores(toy_registry):
    model = build_model(spec({"kind": "regression", "outputs": 1}, {"channels": 2}, core={"kind": "toy-diag", "preset": "tiny"}), seed=0)
    with pytest.raises(ValueError, match="discrete-time"):
        rescale_sampling_rate(model, 2.0)


def test_build_is_deterministic_with_seed():
    a, b = (build_model(CASES["regression-rms-linear"], seed=5) for _ in range(2))
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n


def test_ema_batch_norm_follows_equinox_legacy_semantics():
    from zoo_core.nn.blocks import EMABatchNorm

    torch.manual_seed(0)
    bn = EMABatchNorm(3, affine=False).train()
    x1, x2 = torch.randn(4, 10, 3) * 2 + 1, torch.randn(4, 10, 3) - 3
    m1, v1 = x1.mean((0, 1)), x1.var((0, 1), unbiased=False)
    torch.testing.assert_close(bn(x1), (x1 - m1) / torch.sqrt(v1 + 1e-5))  # first call: batch stats
    m2 = 0.99 * m1 + 0.01 * x2.mean((0, 1))
    v2 = 0.99 * v1 + 0.01 * x2.var((0, 1), unbiased=False)
    torch.testing.assert_close(bn(x2), (x2 - m2) / torch.sqrt(v2 + 1e-5))  # then the EMA mix
    torch.testing.assert_close(bn.running_mean, m2)
    bn.eval()
    torch.testing.assert_close(bn(x1), (x1 - m2) / torch.sqrt(v2 + 1e-5))  # eval: stored stats
    torch.testing.assert_close(bn(x1[:, 0]), ((x1 - m2) / torch.sqrt(v2 + 1e-5))[:, 0])  # one step


def test_ema_batch_norm_gradient_flows_only_through_the_batch_part():
    from zoo_core.nn.blocks import EMABatchNorm

    torch.manual_seed(1)
    bn = EMABatchNorm(2, affine=False).train()
    x0 = torch.randn(8, 5, 2)
    bn(x0)
    m1, v1 = bn.running_mean.clone(), bn.running_var.clone()
    x = torch.randn(8, 5, 2, requires_grad=True)
    cot = torch.randn(8, 5, 2)
    (gx,) = torch.autograd.grad((bn(x) * cot).sum(), x)
    xr = x.detach().clone().requires_grad_(True)
    mean = 0.99 * m1 + 0.01 * xr.mean((0, 1))  # stored statistics are constants
    var = 0.99 * v1 + 0.01 * xr.var((0, 1), unbiased=False)
    (gr,) = torch.autograd.grad((((xr - mean) / torch.sqrt(var + 1e-5)) * cot).sum(), xr)
    torch.testing.assert_close(gx, gr)


def test_time_channel_streams_like_the_parallel_forward():
    s = spec({"kind": "sequence", "outputs": 2}, {"channels": 3, "include_time": True, "length": 50}, depth=2)
    model = build_model(s, seed=0).double().eval()
    assert model.encoder.in_features == 4
    x = torch.randn(2, 17, 3, dtype=torch.float64)
    with torch.no_grad():
        full = model(x)
        state = model.init_state(2)
        outs = []
        for t in range(17):
            y, state = model.step(x[:, t], state)
            outs.append(y)
        torch.testing.assert_close(torch.stack(outs, 1), full, rtol=1e-9, atol=1e-9)
        _, st = model.forward_with_state(x[:, :9])
        assert int(st.t[0]) == 9


def test_uea_block_preset_and_overrides():
    s = spec({"kind": "classification", "classes": 2}, {"channels": 3}, block={"preset": "uea", "dropout": 0.05})
    model = build_model(s, seed=0)
    block = model.spec["model"]["block"]
    assert block["norm"] == "batch" and block["activation"] == "gelu_tanh" and block["output"] == "glu"
    assert block["dropout"] == 0.05 and block["preset"] == "uea"
    b = model.stack.blocks[0]
    assert b.act.approximate == "tanh" and b.norm.bn.affine
    ema = build_model(spec({"kind": "classification", "classes": 2}, {"channels": 3}, block={"preset": "uea-ema"}), seed=0)
    assert type(ema.stack.blocks[0].norm).__name__ == "EMABatchNorm" and ema.stack.blocks[0].norm.weight is None


def test_rescale_is_all_or_nothing():
    model = build_model(spec({"kind": "regression", "outputs": 1}, {"channels": 2}, depth=2), seed=0)
    second = model.stack.blocks[1].core

    def refuse(factor):
        raise ValueError("this block refuses")

    second.rescale_dt = refuse
    with pytest.raises(ValueError, match="refuses"):
        rescale_sampling_rate(model, 2.0)
    assert [c.dt_scale for c in model.cores()] == [1.0, 1.0] and model.spec["model"]["core"]["dt_scale"] == 1.0


def lrcssm_spec(**kw):
    return spec({"kind": "classification", "classes": 2}, {"channels": 5}, d_model=8, depth=2, core={"kind": "lru", "preset": "tiny"},
                block={"preset": "lrcssm"}, encoder={"kind": "mlp"}, head={"kind": "mlp"}, pool="mean_logits", **kw)


def test_lrcssm_backbone_computes_the_reference_recipe():
    """models.md §12.3: MLP encoder; per layer u = LN(u), s = core(u), v = LN(s + u), u = v + MLP(v)
    (LayerNorms without weight/bias, eps 1e-5); MLP head on every step; logits averaged over time."""
    import torch.nn.functional as F

    model = build_model(lrcssm_spec(), seed=0).double().eval()
    x = torch.randn(2, 11, 5, dtype=torch.float64)
    enc, head = model.encoder, model.head
    with torch.no_grad():
        u = enc[2](torch.relu(enc[0](x)))  # Linear -> ReLU -> Linear
        for block in model.stack.blocks:
            assert block.norm_in.weight is None and block.norm_in.eps == 1e-5
            u = F.layer_norm(u, (8,), eps=1e-5)
            s = block.core(u)
            v = F.layer_norm(s + u, (8,), eps=1e-5)
            u = v + block.mlp[2](torch.relu(block.mlp[0](v)))
        logits = head[2](torch.relu(head[0](u))).mean(dim=1)
        torch.testing.assert_close(model(x), logits)
    core = count_params(model.stack.blocks[0].core)
    expected = (5 * 8 + 8 + 8 * 8 + 8) + 2 * (core + 2 * (8 * 8 + 8)) + (8 * 8 + 8 + 8 * 2 + 2)
    assert count_params(model) == expected
    assert "mlp" in model.spec["model"]["encoder"]["kind"] and model.spec["model"]["block"]["layout"] == "lrcssm"


def test_lrcssm_backbone_shares_and_saves_like_any_block(tmp_path):
    s = lrcssm_spec()
    s["model"]["stacking"] = {"policy": "periodic", "period": 1, "norms": "per_position", "damping": "learned"}
    model = build_model(s, seed=0).eval()
    assert len(model.stack.position_norms[0]) == 2 and model.stack.blocks[0].norm_in is None
    save_pretrained(model, str(tmp_path / "m"))
    loaded = load_pretrained(str(tmp_path / "m"))
    x = torch.randn(2, 7, 5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert loaded.spec == model.spec
    text = summary(model)
    assert "damping α=learned" in text and "norms per_position" in text and "norms       0" in text


def test_summary_reports_reshaping_and_depth_settings():
    s = spec({"kind": "classification", "classes": 2}, {"channels": 3, "reshape": {"c": 12}}, depth=4,
             stacking={"policy": "periodic", "period": 2, "damping": 0.5})
    text = summary(build_model(s, seed=0))
    assert "reshape concat c=12" in text and "damping α=0.5" in text and "period 2" in text


def test_padding_with_a_non_causal_core_is_exact():
    """A bidirectional core would read the padding; it gets each sequence's valid steps alone instead
    (zoo_core.packing), so a padded batch gives what each sample gives unpadded, whatever the padding holds."""
    model = build_model(spec({"kind": "classification", "classes": 2}, {"channels": 3},
                             core={"kind": "s5-bidirectional", "preset": "tiny"}), seed=0).eval()
    x = torch.randn(2, 6, 3)
    x[1, 4:] = 1e3
    with torch.no_grad():
        y = model(x, lengths=torch.tensor([6, 4]))
        torch.testing.assert_close(y[1], model(x[1:, :4])[0])
        torch.testing.assert_close(y[0], model(x[:1])[0])


def test_tied_embeddings_start_small():
    """A tied LM head starts near uniform (N(0, 0.02) embedding), not with logits ~√d_model wide."""
    import math

    model = build_model(spec({"kind": "lm"}, {"vocab_size": 84}, d_model=64, tie_embeddings=True, final_norm="rms"), seed=0)
    assert model.encoder.weight.std().item() < 0.03
    ids = torch.randint(0, 84, (4, 16))
    loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 84), ids.roll(-1, 1).reshape(-1))
    assert loss.item() < 2 * math.log(84)


def _methods(cls_name: str, path: str):
    import ast
    from pathlib import Path

    tree = ast.parse(Path(path).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name]
    return [f for f in cls.body if isinstance(f, ast.FunctionDef)]


def test_the_model_reads_no_strings_on_its_forward_and_step_paths():
    """Pools, reshaping and state parts are objects chosen at build time: no method after __init__
    compares a string (``self.pool == "none"``) or reads a string-keyed state (``state["layer0.h"]``)."""
    import ast

    import zoo_core.nn.model

    found = []
    for fn in _methods("SequenceModel", zoo_core.nn.model.__file__):
        if fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            strings = [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if isinstance(node, ast.Compare) and any(s in strings for s in [node.left, *node.comparators]):
                found.append(f"{fn.name}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.append(f"{fn.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_the_model_modules_call_nothing_private_across_modules():
    """adaptive.py used model._embed/_readout; every model-assembly module now calls public names only
    (flops.py is left out: torch's op objects are spelled with underscores)."""
    import ast
    from pathlib import Path

    import zoo_core

    root = Path(zoo_core.__file__).parent
    found = []
    for name in ("nn/model", "nn/model_state", "nn/pools", "nn/adaptive", "nn/blocks", "nn/stack", "stacking_policies",
                 "nn/reshape", "generate"):
        path = root / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{name}.py:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and any(a.name.startswith("_") for a in node.names):
                found.append(f"{name}.py:{node.lineno}: {ast.unparse(node)}")
    assert not found, found
