"""Attention against an independent explicit loop, naive vs sdpa (outputs, final state, every
gradient, float64), streaming in pieces and token by token across the ring buffer's wrap-around,
padding, the bidirectional variant, bad arguments, specs, save/load and ``zoo stream``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from zoo_attention.core import Attention, AttentionBidirectional, NotCausalError
from zoo_core.build import build_model
from zoo_core.errors import CoreArgumentError
from zoo_core.testing import assert_close

F64 = torch.float64
SPECS = Path(__file__).resolve().parents[1] / "specs"
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def make(cls: type = Attention, *, seed: int = 0, **kw: object) -> Attention:
    torch.manual_seed(seed)
    kw = {"d_model": 12, "n_heads": 3, **kw}
    return cls(**kw, dtype=F64)


def xs(B: int, L: int, H: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randn(B, L, H, generator=torch.Generator().manual_seed(seed), dtype=F64)


# the independent reference: one query at a time, RoPE as a complex rotation ------------------------
def rope_complex(x: torch.Tensor, p: int, base: float) -> torch.Tensor:
    """Rotate pairs (i, i + D/2) of x (D,) by p·base^(−2i/D), as complex multiplication."""
    half = x.shape[0] // 2
    theta = torch.tensor([p * base ** (-2 * i / x.shape[0]) for i in range(half)], dtype=F64)
    z = torch.complex(x[:half], x[half:]) * torch.polar(torch.ones_like(theta), theta)
    return torch.cat([z.real, z.imag])


def loop_reference(core: Attention, x: torch.Tensor, lengths: list[int] | None = None, start: int = 0) -> torch.Tensor:
    """y (B, L, H) by the definition, query by query, from the core's weights only (positions from ``start``)."""
    B, L, _ = x.shape
    D, G = core.head_dim, core.n_heads // core.n_kv_heads
    W = core.window
    out = torch.zeros(B, L, core.n_heads * D, dtype=F64)
    for b in range(B):
        q, k, v = core.q_proj(x[b]), core.k_proj(x[b]), core.v_proj(x[b])  # (L, ·)
        n = L if lengths is None else lengths[b]
        for h in range(core.n_heads):
            g = h // G  # the key/value head this query head reads
            for i in range(L):
                qi = q[i, h * D:(h + 1) * D]
                if core.rope:
                    qi = rope_complex(qi, start + i, core.rope_base)
                scores, values = [], []
                for j in range(n):
                    if core.causal and (j > i or (W is not None and i - j >= W)):
                        continue
                    if not core.causal and W is not None and abs(i - j) >= W:
                        continue
                    kj = k[j, g * D:(g + 1) * D]
                    if core.rope:
                        kj = rope_complex(kj, start + j, core.rope_base)
                    scores.append(torch.dot(qi, kj) / math.sqrt(D))
                    values.append(v[j, g * D:(g + 1) * D])
                w = torch.softmax(torch.stack(scores), 0)
                out[b, i, h * D:(h + 1) * D] = (w[:, None] * torch.stack(values)).sum(0)
    return core.o_proj(out)


CONFIGS = {
    "mha": {},
    "gqa": {"n_heads": 6, "n_kv_heads": 2},
    "mqa-bias": {"n_heads": 6, "n_kv_heads": 1, "bias": True},
    "window3": {"window": 3},
    "window-gqa": {"window": 4, "n_heads": 6, "n_kv_heads": 3},
    "window-longer-than-L": {"window": 20},
    "window1": {"window": 1},
    "no-rope-odd-head": {"n_heads": 4, "rope": False},  # head_dim 3
    "rope-base": {"rope_base": 500.0},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("cls", [Attention, AttentionBidirectional], ids=["causal", "bidirectional"])
def test_both_backends_equal_the_explicit_loop(name, cls):
    x = xs(2, 11, seed=3)
    for backend in ("naive", "sdpa"):
        core = make(cls, backend=backend, **CONFIGS[name])
        with torch.no_grad():
            assert_close(f"{name} {backend}", loop_reference(core, x), core(x), **TIGHT)


def _outputs_and_grads(core: Attention, x: torch.Tensor, state: dict | None, lengths: torch.Tensor | None = None) -> dict:
    x = x.clone().requires_grad_(True)
    y, final = core.forward_with_state(x, state, lengths=lengths)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    params = dict(core.named_parameters())
    loss = (y * dy).sum() + sum((v * v).sum() for v in final.values() if v.is_floating_point())
    grads = torch.autograd.grad(loss, [x, *params.values()])
    out = {"y": y, "grad x": grads[0], **{f"state {k}": v for k, v in final.items()}}
    out.update({f"grad {n}": g for n, g in zip(params, grads[1:], strict=True)})
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sdpa_equals_naive_outputs_state_and_every_gradient(name):
    """From a carried state (so the cache and ring paths run) at an odd length, float64; the loss
    also reads the final state, so its gradient path is compared too."""
    x, prefix = xs(2, 13, seed=4), xs(2, 7, seed=5)
    got = {}
    for backend in ("naive", "sdpa"):
        core = make(backend=backend, **CONFIGS[name])
        with torch.no_grad():
            _, state = core.forward_with_state(prefix)
        got[backend] = _outputs_and_grads(core, x, state)
        got[backend + " from zero"] = _outputs_and_grads(core, x, None, lengths=torch.tensor([13, 9]))
    for suffix in ("", " from zero"):
        for key, ref in got["naive" + suffix].items():
            assert_close(f"{name}{suffix}: {key}", ref, got["sdpa" + suffix][key], **TIGHT)


def test_bidirectional_sdpa_equals_naive_with_padding_and_a_window():
    x, lengths = xs(3, 9, seed=6), torch.tensor([9, 4, 1])
    for kw in ({}, {"window": 3, "n_heads": 6, "n_kv_heads": 2}):
        got = [_outputs_and_grads(make(AttentionBidirectional, backend=b, **kw), x, None, lengths) for b in ("naive", "sdpa")]
        for key, ref in got[0].items():
            assert_close(f"bidirectional {kw}: {key}", ref, got[1][key], **TIGHT)


@pytest.mark.parametrize("window", [None, 1, 3, 4, 20])
@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_streaming_in_pieces_and_steps_equals_the_whole(window, backend):
    """Chunks of 1, 2, 3, 5, 1, 4 (boundaries inside and across the ring's wrap-around) and one token
    at a time equal one forward: outputs, and the final cache (same keys in the same slots)."""
    core = make(backend=backend, window=window, n_heads=6, n_kv_heads=2).eval()
    x = xs(2, 16, seed=7)
    with torch.no_grad():
        y, whole = core.forward_with_state(x)
        pieces, state, t = [], core.init_state(2), 0
        for n in (1, 2, 3, 5, 1, 4):
            y_n, state = core.forward_with_state(x[:, t:t + n], state)
            pieces.append(y_n)
            t += n
        assert_close("pieces", y, torch.cat(pieces, 1), **TIGHT)
        for k in whole:
            assert_close(f"pieces state {k}", whole[k], state[k], **TIGHT)
        steps, state = [], core.init_state(2)
        for i in range(16):
            y_t, state = core.step(x[:, i], state)
            steps.append(y_t)
        assert_close("steps", y, torch.stack(steps, 1), **TIGHT)
        for k in whole:
            assert_close(f"step state {k}", whole[k], state[k], **TIGHT)
    slots = 16 if window is None else window
    assert state["k"].shape == (2, 2, slots, 2) and state["pos"].tolist() == [16, 16]


def test_positions_continue_across_chunks():
    """The second chunk's queries are at positions 9…15 against cached keys at 0…8: it equals the loop
    over the whole sequence. (RoPE scores depend on p_i − p_j only, so a chunk whose positions restart
    at 0 while the cache keeps 0…8 reads the cache at the wrong distances: it must differ.)"""
    core = make(window=4)
    x = xs(1, 16, seed=8)
    with torch.no_grad():
        _, state = core.forward_with_state(x[:, :9])
        assert_close("continued positions", loop_reference(core, x)[:, 9:], core(x[:, 9:], state), **TIGHT)
        restarted = core(x[:, 9:], {**state, "pos": torch.zeros_like(state["pos"])})
        with pytest.raises(AssertionError):
            assert_close("restarted positions", loop_reference(core, x)[:, 9:], restarted, **TIGHT)


def test_ring_buffer_holds_the_last_window_keys_in_their_slots():
    """After 11 tokens with W = 4 the ring holds positions 8, 9, 10, 7 in slots 0…3 (p mod W)."""
    core = make(window=4, rope=False, n_heads=1)
    x = xs(1, 11, seed=2)
    with torch.no_grad():
        _, state = core.forward_with_state(x)
        keys = core.k_proj(x)[0]  # (L, H) without RoPE: the cached keys exactly
    for slot, p in enumerate((8, 9, 10, 7)):
        assert_close(f"slot {slot}", keys[p], state["k"][0, 0, slot], **TIGHT)


@pytest.mark.parametrize("cls", [Attention, AttentionBidirectional], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_padded_keys_never_reach_valid_queries(cls, backend):
    """A padded batch gives each sample's valid outputs as if it ran alone, whatever the padding holds."""
    core = make(cls, backend=backend, window=None if cls is Attention else 5)
    x = xs(3, 10, seed=11)
    lengths = torch.tensor([10, 6, 3])
    noisy = x.clone()
    for b, n in enumerate(lengths.tolist()):
        noisy[b, n:] = 1e3 * torch.randn(10 - n, 12, dtype=F64)
    with torch.no_grad():
        y = core(noisy, lengths=lengths)
        for b, n in enumerate(lengths.tolist()):
            assert_close(f"sample {b}", core(x[b:b + 1, :n])[0], y[b, :n], **TIGHT)
            assert_close(f"sample {b} loop", loop_reference(core, x[b:b + 1, :n])[0], y[b, :n], **TIGHT)


@pytest.mark.parametrize("cls", [Attention, AttentionBidirectional], ids=["causal", "bidirectional"])
def test_a_query_whose_window_holds_only_padding_gives_zero_not_nan(cls):
    """Length 2, window 2, L 9: queries 4… read no valid key. Both backends give 0 there (sdpa's
    rule), so a second layer's valid outputs and every gradient stay finite and equal."""
    x, lengths = xs(2, 9, seed=12), torch.tensor([9, 2])
    got = {}
    for backend in ("naive", "sdpa"):
        core = make(cls, backend=backend, window=2)
        xg = x.clone().requires_grad_(True)
        y1 = core(xg, lengths=lengths)
        y2 = core(y1, lengths=lengths)  # the padded rows of y1 are the second layer's (masked) keys
        (grad,) = torch.autograd.grad((y2[1, :2] ** 2).sum() + (y2[0] ** 2).sum(), xg)
        got[backend] = {"y1": y1.detach(), "y2": y2.detach(), "grad x": grad}
        assert all(bool(torch.isfinite(t).all()) for t in got[backend].values()), backend
    for key, ref in got["naive"].items():
        assert_close(key, ref, got["sdpa"][key], **TIGHT)


def test_bidirectional_reads_the_future_and_refuses_streaming():
    core = make(AttentionBidirectional)
    x = xs(1, 9)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    with torch.no_grad():
        assert (core(x)[:, :6] - core(x2)[:, :6]).abs().max() > 1e-3
    for call in (lambda: core.step(x[:, 0], {}), lambda: core.init_state(1), lambda: core(x, {"k": x})):
        with pytest.raises(NotCausalError, match="attention-bidirectional cannot .*use the causal core 'attention'"):
            call()
    spec = {"schema_version": 1, "task": {"kind": "classification", "classes": 3}, "input": {"channels": 12},
            "model": {"d_model": 12, "depth": 1, "core": {"kind": "attention-bidirectional", "n_heads": 3}}}
    model = build_model(spec, seed=0, dtype=F64).eval()
    x2 = torch.cat([x, xs(1, 9, seed=5) * 1e3])  # a padded batch reaches the core as documents (its native packed path)
    with torch.no_grad():
        padded = model(x2, lengths=torch.tensor([9, 5]))
        assert_close("padded sample", model(x2[1:, :5])[0], padded[1], **TIGHT)
        assert_close("full sample", model(x)[0], padded[0], **TIGHT)


@pytest.mark.parametrize(("kw", "field", "rule"), [
    ({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads", "must divide n_heads"),
    ({"n_heads": 5}, "n_heads", "must divide d_model"),
    ({"window": 0}, "window", "greater than or equal to 1"),
    ({"window": -3}, "window", "greater than or equal to 1"),
    ({"n_heads": 4}, "head_dim", "must be even with rope"),
    ({"rope_base": 1.0}, "rope_base", "greater than 1"),
])
def test_bad_arguments_name_the_field_and_the_rule(kw, field, rule):
    with pytest.raises(CoreArgumentError, match=rf"Attention: invalid constructor argument.*{field}.*{rule}"):
        Attention(d_model=12, **kw)
    spec = {"schema_version": 1, "task": {"kind": "sequence", "outputs": 2}, "input": {"channels": 3},
            "model": {"d_model": 12, "depth": 1, "core": {"kind": "attention", **kw}}}
    with pytest.raises(Exception, match=field):
        build_model(spec)


def test_unknown_backend_is_refused_clearly():
    with pytest.raises(Exception, match="backends this core can use: auto, naive, .*sdpa"):
        Attention(d_model=8, n_heads=2, backend="flash")


def test_auto_picks_sdpa_and_naive_is_the_reference():
    assert Attention(8, n_heads=2).backend_choice.entries["attention"].name == "sdpa"
    assert Attention(8, n_heads=2, backend="naive").backend_choice.entries["attention"].name == "naive"


@pytest.mark.parametrize("spec", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_specs_build_and_run(spec):
    model = build_model(spec, seed=0).eval()
    channels = model.spec["input"]["channels"]
    with torch.no_grad():
        y = model(torch.randn(2, 17, channels))
    assert y.shape[0] == 2 and bool(torch.isfinite(y).all())


def test_a_model_streams_a_growing_cache_and_reports_it(tmp_path):
    """Whole-model step = forward without a window, and a windowed model's streaming state stays the same size."""
    spec = {"schema_version": 1, "task": {"kind": "sequence", "outputs": 2}, "input": {"channels": 3},
            "model": {"d_model": 8, "depth": 2, "core": {"kind": "attention", "n_heads": 2}}}
    for window, grows in ((None, True), (3, False)):
        spec["model"]["core"]["window"] = window
        model = build_model(spec, seed=0, dtype=F64).eval()
        x = torch.randn(2, 9, 3, dtype=F64)
        with torch.no_grad():
            state = model.init_state(2, dtype=F64)
            sizes, ys = [], []
            for t in range(9):
                y_t, state = model.step(x[:, t], state)
                ys.append(y_t)
                sizes.append(sum(v.numel() for v in state.flatten().values()))
            assert_close(f"model step window={window}", model(x), torch.stack(ys, 1), **TIGHT)
        assert (sizes[-1] > sizes[0]) is grows and all(c.hparams.grows_state() is grows for c in model.cores())


# the zoo's workflows --------------------------------------------------------------------------------
def _jv_spec() -> dict:
    """Windowed attention shared ABAB across depth with damping, on JapaneseVowels (padded batches)."""
    return {"schema_version": 1, "name": "attention-jv-smoke",
            "task": {"kind": "classification", "classes": 9}, "input": {"channels": 12},
            "model": {"d_model": 8, "depth": 4, "stacking": {"policy": "periodic", "period": 2, "damping": 0.5},
                      "block": {"norm": "layer", "prenorm": True, "dropout": 0.0},
                      "core": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1, "window": 6}},
            "training": {"dataset": "JapaneseVowels", "protocol": "seed-split", "epochs": 1, "batch_size": 64,
                         "lr": 3e-3}}


@pytest.mark.requires("aeon")
def test_train_eval_adaptive_and_stream_on_japanese_vowels(tmp_path):
    """zoo train (padded batches, shared depth with damping), zoo eval with adaptive depth, and zoo
    stream of the windowed core: constant streaming state, step = parallel (zoo_core.testing.workflows)."""
    from zoo_core.testing.workflows import check_workflows

    spec = _jv_spec()["model"]
    shown = check_workflows(spec["core"], tmp_path, depth=spec["depth"], stacking=spec["stacking"], block=spec["block"],
                            max_depth=4)
    assert "independent of sequence length" in shown["stream"]  # the ring buffer


def test_input_reshaping_streams_like_the_parallel_model():
    """Reshaped input (c = 6: two raw steps of 3 channels per model step), windowed attention: each
    streamed prefix gives the parallel prediction."""
    spec = {"schema_version": 1, "task": {"kind": "classification", "classes": 3},
            "input": {"channels": 3, "reshape": {"c": 6}},
            "model": {"d_model": 8, "depth": 2,
                      "core": {"kind": "attention", "n_heads": 2, "window": 3}}}
    model = build_model(spec, seed=0, dtype=F64).eval()
    x = torch.randn(2, 7, 3, dtype=F64)
    with torch.no_grad():
        state = model.init_state(2, dtype=F64)
        for t in range(7):
            y_t, state = model.step(x[:, t], state)
            assert_close(f"prefix {t + 1}", model(x[:, :t + 1]), y_t, rtol=1e-9, atol=1e-11)


def test_flop_counter_prices_both_backends_alike():
    """The two attention matrix products (QKᵀ and PV: 4·B·Hq·L²·D) are counted for sdpa's CPU kernel as
    for the written-out softmax's bmm, grouped heads included (that kernel was priced at zero before)."""
    from zoo_core.flops import count_flops

    x = torch.randn(2, 33, 12)
    by_op = {}
    for backend in ("naive", "sdpa"):
        core = Attention(12, n_heads=6, n_kv_heads=2, backend=backend)
        with torch.no_grad(), count_flops() as fc:
            core(x)
        by_op[backend] = fc.by_op
    matmuls = 4 * 2 * 6 * 33 * 33 * 2  # B = 2, Hq = 6, L = 33, D = 2
    assert by_op["naive"]["bmm"] == matmuls
    assert sum(n for op, n in by_op["sdpa"].items() if "attention" in op or op == "bmm") == matmuls


def test_griffin_style_hybrid_streams_like_the_parallel_model():
    """Two recurrent blocks per local-attention block (model.cores + model.pattern): stepping the
    whole hybrid equals its parallel forward, the attention positions carrying their ring buffers."""
    spec = {"schema_version": 1, "task": {"kind": "sequence", "outputs": 3}, "input": {"channels": 4},
            "model": {"d_model": 8, "depth": 6, "core": {"kind": "lru", "preset": "tiny"},
                      "cores": {"local": {"kind": "attention", "n_heads": 2, "window": 4}},
                      "pattern": ["core", "core", "local"]}}
    model = build_model(spec, seed=0, dtype=F64).eval()
    assert [type(model.stack.block(model.stack.block_index(p)).core).__name__ for p in range(6)].count("Attention") == 2
    x = torch.randn(2, 11, 4, dtype=F64)
    with torch.no_grad():
        state, ys = model.init_state(2, dtype=F64), []
        for t in range(11):
            y_t, state = model.step(x[:, t], state)
            ys.append(y_t)
        assert_close("hybrid step vs forward", model(x), torch.stack(ys, 1), **TIGHT)
