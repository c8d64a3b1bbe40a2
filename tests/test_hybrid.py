"""Hybrid stacks: a spec places named cores per depth position (``model.cores`` with a repeating
``model.pattern`` or explicit ``model.positions``), and everything the zoo does with a stack —
stacking policies, save/load, streaming, adaptive depth, FLOP counting, the size estimate — works
position by position. Cores: lru (diagonal recurrence), s4d (LTI convolution), mamba (selective)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._pytree import tree_leaves

from zoo_core.build import build_model, summary
from zoo_core.errors import SpecError
from zoo_core.factory import load_pretrained
from zoo_core.flops import count_flops
from zoo_core.footprint import estimate
from zoo_core.io.pretrained import save_pretrained
from zoo_core.nn.blocks import count_params, make_block
from zoo_core.plugins import get_registry
from zoo_core.spec import load_spec
from zoo_core.testing.helpers import model_spec, unroll

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]


def hybrid(depth: int = 6, *, pattern: list[str] | None = None, positions: dict | None = None, **model) -> dict:
    """lru as the default core, s4d as ``conv`` and mamba as ``sel``; a pattern [core, conv, sel] by default."""
    pattern = pattern if pattern is not None or positions is not None else ["core", "conv", "sel"]
    used = set(pattern or []) | set(positions or {})
    named = {"conv": {"kind": "s4d", "preset": "tiny"}, "sel": {"kind": "mamba", "preset": "tiny"}}
    body = {"cores": {k: v for k, v in named.items() if k in used}, **model}
    body.update({"positions": positions} if positions is not None else {"pattern": pattern})
    return model_spec("lru", depth=depth, **body)


def kinds(model) -> list[str]:
    """The registered kind of the core at each depth position (by class, as the registry loads it)."""
    by_class = {e.load(): n for n, e in get_registry().cores.items() if n in ("lru", "s4d", "mamba")}
    return [by_class[type(model.stack.block(model.stack.block_index(p)).core)] for p in range(model.stack.depth)]


# the schema -----------------------------------------------------------------------------------
def test_a_plain_spec_is_one_core_everywhere_and_saves_no_hybrid_keys():
    spec = load_spec(model_spec("lru", depth=3))
    assert spec.layout == ("core",) * 3 and not spec.hybrid
    assert set(spec.resolved()["model"]) & {"cores", "pattern", "positions"} == set()


def test_a_pattern_repeats_over_the_depth():
    spec = load_spec(hybrid(6))
    assert spec.layout == ("core", "conv", "sel") * 2 and spec.hybrid
    assert kinds(build_model(spec, seed=0)) == ["lru", "s4d", "mamba"] * 2


def test_positions_place_named_cores_over_the_default():
    spec = load_spec(hybrid(8, positions={"conv": [3, 7], "sel": [8]}))
    assert spec.layout == ("core", "core", "conv", "core", "core", "core", "conv", "sel")
    assert kinds(build_model(spec, seed=0)) == ["lru", "lru", "s4d", "lru", "lru", "lru", "s4d", "mamba"]


def test_every_named_core_is_resolved_in_full_and_the_resolved_spec_reloads_the_same():
    spec = load_spec(hybrid(3))
    out = spec.resolved()["model"]
    assert out["cores"]["conv"]["kind"] == "s4d" and "preset" not in out["cores"]["conv"]
    assert out["cores"]["conv"]["d_state"] == spec.named["conv"][1].d_state  # the tiny preset, written out
    again = load_spec(spec.resolved())
    assert again.resolved() == spec.resolved() and again.layout == spec.layout


def _error(tmp_path: Path, body: dict) -> str:
    """The message a spec written to a file gets (with its file:line:col)."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(model_spec("lru", **body), sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value).replace(str(path), "s.yaml")


CORES = {"conv": {"kind": "s4d", "preset": "tiny"}}


def test_a_pattern_that_does_not_fit_the_depth_names_both(tmp_path):
    msg = _error(tmp_path, {"depth": 4, "cores": CORES, "pattern": ["core", "core", "conv"]})
    assert msg == ("s.yaml:17:3: model.pattern: the pattern [core, core, conv] has 3 entries, which does not fit depth 4: "
                   "it repeats over the depth, so the depth must be a multiple of 3 (e.g. 3 or 6), or use a pattern "
                   "whose length divides 4")


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    msg = _error(tmp_path, {"depth": 2, "cores": CORES, "pattern": ["core", "cnv"]})
    assert msg == ("s.yaml:19:5: model.pattern.1: unknown core name 'cnv'; did you mean 'conv'? known names (model.core "
                   "is 'core', model.cores the others): conv, core")
    msg = _error(tmp_path, {"depth": 2, "cores": CORES, "positions": {"attn": [2]}})
    assert msg.endswith("model.positions.attn: unknown core name 'attn'; model.cores names: conv")


@pytest.mark.parametrize("body, where, message", [
    ({"positions": {"conv": [5]}}, "model.positions.conv.0",
     "position 5 is past depth 4: positions count from 1 to 4"),
    ({"positions": {"conv": [2, 2]}}, "model.positions.conv.1",
     "position 2 is listed twice for 'conv'; list each position once"),
    ({"positions": {"core": [1]}}, "model.positions.core",
     "the default core runs at every position not listed; list only named cores (model.cores: conv) here"),
    ({"positions": {"conv": []}}, "model.positions.conv",
     "core 'conv' has no positions: list at least one (1 to 4) or remove it"),
    ({}, "model.cores",
     "model.cores names cores that no depth position runs: place them with model.pattern (e.g. [core, core, attn]) "
     "or model.positions (e.g. {attn: [3, 7]})"),
    ({"pattern": ["conv"], "positions": {"conv": [1]}}, "model.positions",
     "set one of model.pattern (core names repeated over the depth) or model.positions (named core -> depth "
     "positions), not both"),
    ({"pattern": ["conv"]}, "model.core",
     "the default core (model.core, kind 'lru') runs at no depth position: name 'core' in the placement, or move one "
     "of the named cores to model.core"),
    ({"pattern": ["core"]}, "model.cores.conv", "core 'conv' runs at no depth position: name it in model.pattern or remove it"),
    ({"cores": {"core": {"kind": "s4d"}}, "pattern": ["core"]}, "model.cores.core",
     "'core' is the name of the default core (model.core) in model.pattern; give this core another name"),
])
def test_placements_that_do_not_fit_are_refused_at_the_key(tmp_path, body, where, message):
    msg = _error(tmp_path, {"depth": 4, "cores": CORES, **body})
    assert msg.split(": ", 1)[1] == f"{where}: {message}", msg
    assert msg.startswith("s.yaml:")  # line and column of the key


def test_the_schema_stays_strict(tmp_path):
    assert "model.pattern.0: Input should be a valid string" in _error(tmp_path, {"cores": CORES, "pattern": [1]})
    assert "String should match pattern" in _error(tmp_path, {"cores": {"a b": {"kind": "s4d"}}, "pattern": ["core"]})
    assert "model.positions.conv.0: Input should be greater than 0" in _error(tmp_path, {"cores": CORES, "positions": {"conv": [0]}})


def test_each_named_core_is_validated_by_its_own_params_model(tmp_path):
    msg = _error(tmp_path, {"cores": {"conv": {"kind": "s4d", "preset": "tiny", "d_state": 0}}, "pattern": ["core", "conv"]})
    assert "model.cores.conv.d_state: Input should be greater than" in msg
    msg = _error(tmp_path, {"cores": {"conv": {"kind": "s4e"}}, "pattern": ["core", "conv"]})
    assert "model.cores.conv.kind: " in msg and "'s4d'" in msg
    msg = _error(tmp_path, {"cores": {"conv": {"kind": "s4d", "d_model": 4}}, "pattern": ["core", "conv"]})
    assert "model.cores.conv.d_model: d_model is set once for the whole model: move it to model.d_model" in msg
    msg = _error(tmp_path, {"cores": {"conv": {"kind": "s4d", "preset": "huge"}}, "pattern": ["core", "conv"]})
    assert "model.cores.conv.preset: " in msg


def test_positions_sharing_a_block_must_run_the_same_core(tmp_path):
    msg = _error(tmp_path, {"depth": 4, "cores": CORES, "pattern": ["core", "conv"],
                            "stacking": {"policy": "periodic", "period": 1}})
    assert msg.split(": ", 1)[1] == (
        "model.stacking: depth positions 1 and 2 share block A (stacking policy 'periodic', period 1: AAAA) but run "
        "different cores: 'core' (lru) at 1, 'conv' (s4d) at 2. A block holds one core, so the blocks must repeat with "
        "the core placement (it repeats every 2 position(s)): use a period that is a multiple of 2, or policy independent")
    # the same placement with a period of the pattern's length (or a multiple) is fine
    for period in (2, 4):
        load_spec(hybrid(4, pattern=["core", "conv"], stacking={"policy": "periodic", "period": period}))


# the stack ------------------------------------------------------------------------------------
def test_a_hybrid_stack_equals_a_hand_built_composition_of_the_same_blocks():
    spec = load_spec(hybrid(5, positions={"conv": [2], "sel": [4, 5]}, block={"norm": "layer"}))
    model = build_model(spec, seed=0).double().eval()
    reg = get_registry()
    by_kind = {"core": "lru", "conv": "s4d", "sel": "mamba"}
    hand = []
    for pos, name in enumerate(("core", "conv", "core", "sel", "sel")):
        entry = reg.cores[by_kind[name]]
        params = entry.params.model_validate({**entry.preset("tiny"), "d_model": 6})
        block = make_block("residual", entry.instantiate(**params.model_dump()), 6, **spec.envelope.model.block.recipe())
        block.load_state_dict(model.stack.block(pos).state_dict())  # strict: the same core kind, the same shapes
        hand.append(block.double().eval())
    x = torch.randn(2, 9, 3, dtype=F64)
    with torch.no_grad():
        h = model.encoder(x)
        for block in hand:
            h = block(h)
        torch.testing.assert_close(model(x), model.head(model.final_norm(h).mean(1)), rtol=1e-12, atol=1e-12)


def test_periodic_sharing_of_a_hybrid_period_shares_exactly_its_blocks():
    shared = build_model(hybrid(6, pattern=["core", "conv"], stacking={"policy": "periodic", "period": 2}), seed=0)
    alone = build_model(hybrid(6, pattern=["core", "conv"]), seed=0)  # independent: six blocks
    st = shared.stack
    assert st.schedule == [0, 1] * 3 and st.core_names == ["core", "conv"]
    assert kinds(shared) == ["lru", "s4d"] * 3
    for pos in range(6):  # positions 1, 3, 5 run the very same parameters, as do 2, 4, 6
        assert st.block(st.block_index(pos)) is st.block(pos % 2)
    lru_block, s4d_block = (count_params(st.block(i)) for i in (0, 1))
    assert lru_block != s4d_block
    rest = count_params(shared.encoder) + count_params(shared.head) + count_params(shared.final_norm)
    assert count_params(shared) == rest + lru_block + s4d_block
    assert count_params(alone) == rest + 3 * (lru_block + s4d_block)
    # a gradient reaches a shared block from each of its three positions
    x = torch.randn(2, 5, 3)
    shared(x).sum().backward()
    assert all(p.grad is not None for p in st.block(1).core.parameters())


def test_per_position_norms_and_learned_damping_work_across_cores():
    model = build_model(hybrid(4, pattern=["core", "conv"], block={"norm": "layer"},
                               stacking={"policy": "periodic", "period": 2, "norms": "per_position", "damping": "learned"}),
                        seed=0).double().eval()
    assert len(model.stack.position_norms) == 4 and model.stack.damping_logit.shape == (2,)
    x = torch.randn(2, 7, 3, dtype=F64)
    outs = unroll(model, x)
    with torch.no_grad():
        torch.testing.assert_close(outs[-1], model(x), rtol=1e-9, atol=1e-11)


def test_save_and_load_give_the_same_outputs(tmp_path):
    model = build_model(hybrid(6, pattern=["core", "conv", "sel"], stacking={"policy": "periodic", "period": 3}), seed=0).eval()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m").eval()
    assert loaded.spec == model.spec and loaded.stack.core_names == model.stack.core_names
    assert kinds(loaded) == ["lru", "s4d", "mamba"] * 2
    x = torch.randn(3, 11, 3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    stored = json.loads((tmp_path / "m" / "config.json").read_text())
    assert {"lru", "s4d", "mamba"} <= {k.split("-", 1)[-1] for k in stored["versions"]}  # each core's provider recorded


def test_step_equals_forward_through_a_hybrid_stack():
    model = build_model(hybrid(6, task={"kind": "sequence", "outputs": 2}), seed=0).double().eval()
    x = torch.randn(2, 7, 3, dtype=F64)
    with torch.no_grad():
        full = model(x)  # (B, L, O)
        for t, y_t in enumerate(unroll(model, x)):
            torch.testing.assert_close(y_t, full[:, t], rtol=1e-9, atol=1e-11)
        first, state = model.forward_with_state(x[:, :4])  # each position carries its own core's state
        rest, _ = model.forward_with_state(x[:, 4:], state)
        torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=1e-9, atol=1e-11)
    shapes = [[tuple(t.shape) for t in tree_leaves(s)] for s in state.layers]
    assert len(shapes) == 6 and shapes[:3] == shapes[3:] and len({str(s) for s in shapes[:3]}) == 3  # lru, s4d, mamba


def test_adaptive_depth_runs_past_the_depth_and_streams_as_it_runs_in_parallel():
    model = build_model(hybrid(3), seed=0).double().eval()
    x = torch.randn(3, 6, 3, dtype=F64)
    never = model.adaptive(x, epsilon=1e-300, count_flops=False)
    assert never.depth.tolist() == [3, 3, 3]
    torch.testing.assert_close(never.output, model(x).detach())
    past = model.adaptive(x, epsilon=1e-12, max_depth=6, stop_at="block", count_flops=False)
    assert past.depth.tolist() == [6, 6, 6]  # positions 4-6 repeat the placement: lru, s4d, mamba
    assert [model.stack.core_name(p) for p in range(6)] == ["core", "conv", "sel"] * 2
    state = model.adaptive_init_state(3, max_depth=6, stop_at="block")
    for t in range(x.shape[1]):
        res, state = model.adaptive_step(x[:, t], state, epsilon=0.05)
        ref = model.adaptive(x[:, : t + 1], epsilon=0.05, max_depth=6, stop_at="block", count_flops=False)
        assert res.depth.tolist() == ref.depth.tolist()
        torch.testing.assert_close(res.output, ref.output, rtol=1e-8, atol=1e-10)


def test_the_flop_count_is_the_sum_of_the_positions_counts():
    model = build_model(hybrid(6), seed=0).eval()
    x = torch.randn(2, 9, 3)
    with torch.no_grad():
        h = model.encoder(x)
        with count_flops() as whole:
            model.stack(h)
        parts = []
        for pos in range(model.stack.depth):
            block = model.stack.block(model.stack.block_index(pos))
            with count_flops() as fc:
                y = block(h)
            with count_flops() as core:
                block.core(block.norm(h))
            parts.append((fc.total, core.total))
            h = y
    assert whole.total == sum(p for p, _ in parts)
    cores = [c for _, c in parts]
    assert cores[:3] == cores[3:] and len(set(cores[:3])) == 3  # each kind costs its own, the same at each repeat


def test_build_prints_the_placement_and_the_size_estimate_counts_every_core():
    spec = load_spec(hybrid(4, pattern=["core", "conv"], stacking={"policy": "periodic", "period": 2}))
    model = build_model(spec, seed=0)
    text = summary(model)
    assert "model: lru+s4d" in text and "schedule ABAB" in text
    assert "cores: pattern [core, conv]; core = lru, conv = s4d" in text
    assert "  position  1       core (lru)  block A" in text and "  position  4       conv (s4d)  block B" in text
    assert "(s4d core " in text and "(lru core " in text
    fp = estimate(spec, activations=False)
    assert fp.params == count_params(model)


def test_a_non_causal_core_anywhere_makes_the_model_non_causal():
    model = build_model(model_spec("lru", depth=2, cores={"bi": {"kind": "s5-bidirectional", "preset": "tiny"}},
                                   positions={"bi": [2]}), seed=0)
    x = torch.randn(2, 5, 3)
    with torch.no_grad():  # padded batches: exact (the non-causal core sees each sample's valid steps only)
        torch.testing.assert_close(model.eval()(x, torch.tensor([5, 3]))[1], model(x[1:, :3])[0])
    with pytest.raises(Exception, match="s5-bidirectional cannot"):
        unroll(model, x)


def test_next_token_training_refuses_a_non_causal_core_at_any_position():
    from zoo_core.datasets import get_dataset
    from zoo_core.train.run import check_model_fits, training_settings

    jv = get_dataset("JapaneseVowels")  # metadata only, nothing is loaded
    for cores, ok in (({"bi": {"kind": "s5-bidirectional", "preset": "tiny"}}, False), ({"bi": {"kind": "s5", "preset": "tiny"}}, True)):
        spec = load_spec(model_spec("lru", depth=3, task={"kind": "lm"}, inp={"vocab_size": 9},
                                    cores=cores, positions={"bi": [3]}))
        if ok:
            check_model_fits(spec, training_settings(spec), jv)
            continue
        with pytest.raises(SpecError, match="core 's5-bidirectional' reads the sequence backwards"):
            check_model_fits(spec, training_settings(spec), jv)


def test_a_rescaled_sampling_rate_is_stored_for_each_named_core():
    from zoo_core.nn.model import rescale_sampling_rate

    model = build_model(model_spec("s4d", depth=2, cores={"b": {"kind": "s5", "preset": "tiny"}}, pattern=["core", "b"]), seed=0)
    rescale_sampling_rate(model, 2.0)
    assert model.spec["model"]["core"]["dt_scale"] == 2.0 and model.spec["model"]["cores"]["b"]["dt_scale"] == 2.0


# the shipped examples -------------------------------------------------------------------------
def _needs(*cores: str) -> None:
    missing = [c for c in cores if c not in get_registry().cores]
    if missing:
        pytest.skip(f"core(s) {', '.join(missing)} not installed (pip install -e plugins/zoo-<name>)")


@pytest.mark.parametrize("name, cores, layout", [
    ("griffin-jv", ("rglru", "attention"), ("core", "core", "local_attn") * 2),
    ("jamba-jv", ("mamba", "attention"), ("core",) * 4 + ("attn",) + ("core",) * 3),
])
def test_the_example_specs_build_forward_and_stream(name, cores, layout):
    _needs(*cores)
    spec = load_spec(ROOT / "specs" / f"{name}.yaml")
    assert spec.layout == layout
    model = build_model(spec, seed=0).double().eval()
    x = torch.randn(2, 7, 12, dtype=F64)
    with torch.no_grad():
        y = model(x)
        assert y.shape == (2, 9) and torch.isfinite(y).all()
        torch.testing.assert_close(unroll(model, x)[-1], y, rtol=1e-8, atol=1e-10)
        shorter = model(x, torch.tensor([7, 4]))  # padded batches: every core is causal
        torch.testing.assert_close(shorter[1], model(x[1:, :4])[0], rtol=1e-8, atol=1e-10)
