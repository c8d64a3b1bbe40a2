"""The chunked WY form equals the sequential recurrence (outputs, final state and every gradient,
float64) at odd lengths and across chunk boundaries; both equal fla's naive references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo_core.testing.helpers import assert_slice_backward_linear
from zoo_gdn.ops import gated_delta_chunked, gated_delta_sequential, gated_delta_step

F64 = torch.float64


def inputs(B: int, L: int, H: int, K: int, V: int, *, dtype: torch.dtype = F64, seed: int = 0,
           neg_eig: bool = False, strong_decay: bool = False) -> dict[str, torch.Tensor]:
    """q, k unit-norm, β ∈ (0, 1) (or (0, 2)), g ≤ 0, and a non-zero initial state."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    g = -torch.rand(B, L, H, generator=gen, dtype=dtype) * (8.0 if strong_decay else 0.5)
    return {"q": F.normalize(r(B, L, H, K), dim=-1) * K**-0.5, "k": F.normalize(r(B, L, H, K), dim=-1),
            "v": r(B, L, H, V), "beta": torch.rand(B, L, H, generator=gen, dtype=dtype) * (2 if neg_eig else 1),
            "g": g, "h0": r(B, H, K, V)}


def run(fn, x: dict[str, torch.Tensor], chunk_size: int) -> dict[str, torch.Tensor]:
    """Outputs, final state and the gradients of every input under a random loss on both."""
    x = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, S = fn(x["q"], x["k"], x["v"], x["beta"], x["g"], x["h0"], chunk_size=chunk_size)
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() + (S * torch.randn(S.shape, generator=gen, dtype=S.dtype)).sum()
    loss.backward()
    return {"o": o.detach(), "S": S.detach(), **{f"d{n}": t.grad for n, t in x.items()}}


@pytest.mark.parametrize("L,chunk", [(1, 4), (7, 4), (8, 4), (9, 4), (37, 8), (37, 64), (23, 1), (16, 16)])
def test_chunked_equals_sequential_with_all_gradients(L, chunk):
    x = inputs(2, L, 3, 5, 7, seed=L)
    ref, out = run(gated_delta_sequential, x, chunk), run(gated_delta_chunked, x, chunk)
    for name in ref:
        torch.testing.assert_close(out[name], ref[name], rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("neg_eig,strong_decay", [(True, False), (False, True)])
def test_chunked_equals_sequential_with_negative_eigenvalues_and_strong_decay(neg_eig, strong_decay):
    """β up to 2 (I − βkkᵀ with a negative eigenvalue) and decays down to e^−8 per step (e^−100 per chunk)."""
    x = inputs(1, 29, 2, 4, 3, neg_eig=neg_eig, strong_decay=strong_decay, seed=3)
    ref, out = run(gated_delta_sequential, x, 12), run(gated_delta_chunked, x, 12)
    for name in ref:
        torch.testing.assert_close(out[name], ref[name], rtol=1e-9, atol=1e-9, msg=lambda m, n=name: f"{n}: {m}")


def test_pieces_with_a_carried_state_equal_the_whole():
    x = inputs(2, 31, 2, 4, 6, seed=5)
    whole, S = gated_delta_chunked(x["q"], x["k"], x["v"], x["beta"], x["g"], x["h0"], chunk_size=4)
    pieces, state = [], x["h0"]
    for a, b in ((0, 5), (5, 18), (18, 19), (19, 31)):
        o, state = gated_delta_chunked(*(x[n][:, a:b] for n in ("q", "k", "v", "beta", "g")), state, chunk_size=4)
        pieces.append(o)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, S, rtol=1e-12, atol=1e-12)


def test_the_step_is_the_written_out_delta_rule():
    """S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ with the matrices written out, o_t = S_tᵀ q_t."""
    x = inputs(1, 1, 1, 4, 3, seed=7)
    q, k, v, beta, g, S0 = (x[n][0, 0, 0] if n != "h0" else x[n][0, 0] for n in ("q", "k", "v", "beta", "g", "h0"))
    S = torch.exp(g) * (torch.eye(4, dtype=F64) - beta * torch.outer(k, k)) @ S0 + beta * torch.outer(k, v)
    o, S_step = gated_delta_step(q[None, None], k[None, None], v[None, None], beta[None, None], g[None, None], S0[None, None])
    torch.testing.assert_close(S_step[0, 0], S)
    torch.testing.assert_close(o[0, 0], S.T @ q)


@pytest.mark.parametrize("fn", [gated_delta_sequential, gated_delta_chunked], ids=["sequential", "chunked"])
def test_an_empty_sequence_passes_the_state_through(fn):
    x = inputs(2, 0, 2, 3, 4)
    o, S = fn(x["q"], x["k"], x["v"], x["beta"], x["g"], x["h0"], chunk_size=4)
    assert o.shape == (2, 0, 2, 4)
    torch.testing.assert_close(S, x["h0"])


def test_zero_initial_state_is_none_and_float32_computes_in_float32():
    x = inputs(1, 10, 2, 3, 3, dtype=torch.float32)
    o1, S1 = gated_delta_chunked(x["q"], x["k"], x["v"], x["beta"], x["g"], None, chunk_size=4)
    o2, S2 = gated_delta_chunked(x["q"], x["k"], x["v"], x["beta"], x["g"], torch.zeros_like(x["h0"]), chunk_size=4)
    assert o1.dtype == S1.dtype == torch.float32
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(S1, S2)


# fla's naive references (fla-core, test-only) -------------------------------------------------
@pytest.fixture(scope="module")
def fla():
    pytest.importorskip("einops", reason="fla's naive references need einops: pip install -e 'plugins/zoo-gdn[test]'")
    from zoo_gdn.fla_reference import FlaUnavailableError, load_fla_naive

    try:
        return load_fla_naive()
    except FlaUnavailableError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("backend", [gated_delta_sequential, gated_delta_chunked], ids=["sequential", "chunked"])
@pytest.mark.parametrize("reference", ["recurrent", "chunk"])
@pytest.mark.parametrize("L", [1, 19, 45])
def test_equals_fla_naive_references(fla, backend, reference, L):
    """Outputs and final state to 1e-5 against both fla references (float32 inside them: they cast),
    with an initial state, odd lengths and L not a multiple of the chunk size 16."""
    x = inputs(2, L, 3, 5, 7, dtype=torch.float32, seed=11 + L)
    q, k, v, beta, g, h0 = (x[n] for n in ("q", "k", "v", "beta", "g", "h0"))
    if reference == "recurrent":
        o_ref, S_ref = fla.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=1.0, initial_state=h0,
                                                            output_final_state=True)
    else:  # note fla's argument order here: g before beta
        o_ref, S_ref = fla.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16, scale=1.0, initial_state=h0,
                                                        output_final_state=True)
    o, S = backend(q, k, v, beta, g, h0, chunk_size=16)
    torch.testing.assert_close(o, o_ref.to(o.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [gated_delta_chunked, gated_delta_sequential])
def test_the_loop_backward_does_not_grow_a_slice_per_chunk_or_step(fn):
    """Both loops (over chunks, over steps) take their pieces by ``unbind``: a slice per chunk or step
    would backpropagate a zero tensor the size of the whole sequence for each (at 256 chunks that made
    the chunked form's forward and backward 5x slower on CPU), so the slice nodes must not multiply
    with the length."""
    def outputs_at(L):  # 4 and 16 chunks of 8
        x = {n: t.requires_grad_() for n, t in inputs(1, L, 2, 4, 3).items()}
        return fn(x["q"], x["k"], x["v"], x["beta"], x["g"], x["h0"], chunk_size=8)

    assert_slice_backward_linear(outputs_at, 32)
