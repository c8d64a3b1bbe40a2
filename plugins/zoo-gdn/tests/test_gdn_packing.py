"""Packed documents (``zoo_core.packing``) in the gated delta rule and the GDN layer: the ops' ``reset``
and ``ends`` keywords equal each document run alone (outputs, final states wherever in a chunk a
document ends, every gradient), the layer runs its own packed path, right padding with wild values
never reaches a state, and float32 at a longer length stays within float32 tolerance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo_core.packing import Segments, run_packed
from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill, long_layout, native_only, packed_input
from zoo_gdn.core import GatedDeltaNet
from zoo_gdn.ops import gated_delta_chunked, gated_delta_sequential

F64 = torch.float64
OPS = {"sequential": gated_delta_sequential, "chunked": gated_delta_chunked}
NAMES = ("q", "k", "v", "beta", "g")


def inputs(B: int, L: int, H: int, K: int, V: int, *, dtype: torch.dtype = F64, seed: int = 0,
           strong_decay: bool = False) -> dict[str, torch.Tensor]:
    """The op's inputs as the layer makes them: q, k unit-norm (q scaled K^−½), β ∈ (0, 1), g ≤ 0
    (down to −8 per step with ``strong_decay``), and an initial state h0."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    return {"q": F.normalize(r(B, L, H, K), dim=-1) * K**-0.5, "k": F.normalize(r(B, L, H, K), dim=-1),
            "v": r(B, L, H, V), "beta": torch.rand(B, L, H, generator=gen, dtype=dtype),
            "g": -torch.rand(B, L, H, generator=gen, dtype=dtype) * (8.0 if strong_decay else 0.5), "h0": r(B, H, K, V)}


def layout() -> Segments:
    """Row 0: documents of 5, 1, 7 steps and 2 padding steps; row 1: 9, 3, 3 (15 steps)."""
    return Segments.from_seq_idx(torch.tensor([[0] * 5 + [1] + [2] * 7 + [-1] * 2, [0] * 9 + [1] * 3 + [2] * 3]))


def end_marks(seg: Segments) -> torch.Tensor:
    ends = torch.zeros(seg.shape, dtype=torch.bool)
    ends[seg.doc_row, seg.doc_end] = True
    return ends


@pytest.mark.parametrize("backend", OPS)
@pytest.mark.parametrize("chunk", [1, 4, 5, 64])
@pytest.mark.parametrize("strong_decay", [False, True], ids=["decay", "strong-decay"])
def test_packed_op_equals_each_document_alone(backend, chunk, strong_decay):
    """Outputs at valid steps, each document's final state (chunks of 4 and 5 end documents mid-chunk
    and put starts mid-chunk) and the gradients of q, k, v, β, g, against the sequential reference on
    each document alone; decays down to e^−8 per step keep the masked exponents' gradients finite."""
    seg = layout()
    x = {n: t.requires_grad_() for n, t in inputs(*seg.shape, 2, 3, 4, seed=chunk, strong_decay=strong_decay).items()
         if n != "h0"}
    o, S = OPS[backend](*(x[n] for n in NAMES), None, chunk_size=chunk, reset=seg.starts, ends=end_marks(seg))
    assert S.shape == (seg.num_docs, 2, 3, 4)
    gen = torch.Generator().manual_seed(2)
    wo, wS = torch.randn(o.shape, generator=gen, dtype=F64) * seg.valid[..., None, None], torch.randn(S.shape, generator=gen, dtype=F64)
    grads = torch.autograd.grad((o * wo).sum() + (S * wS).sum(), [x[n] for n in NAMES])
    for d, (b, s, n) in enumerate(zip(*(t.tolist() for t in (seg.doc_row, seg.doc_start, seg.doc_len)), strict=True)):
        part = {m: x[m][b:b + 1, s:s + n].detach().clone().requires_grad_() for m in NAMES}
        o_d, S_d = gated_delta_sequential(*(part[m] for m in NAMES))
        torch.testing.assert_close(o[b, s:s + n], o_d[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(S[d], S_d[0], rtol=1e-10, atol=1e-10)
        g_d = torch.autograd.grad((o_d[0] * wo[b, s:s + n]).sum() + (S_d[0] * wS[d]).sum(), [part[m] for m in NAMES])
        for m, gp, gr in zip(NAMES, grads, g_d, strict=True):
            assert bool(torch.isfinite(gp).all()), m
            torch.testing.assert_close(gp[b, s:s + n], gr[0], rtol=1e-9, atol=1e-10, msg=lambda e, m=m: f"d{m}: {e}")


@pytest.mark.parametrize("backend", OPS)
def test_no_reset_and_the_last_step_marked_is_the_plain_run(backend):
    """``reset`` all False and ``ends`` on each row's last step give the unpacked outputs and final state,
    from the initial state h0 (the keywords add nothing else)."""
    x = inputs(2, 13, 2, 3, 4, seed=4)
    args = [x[n] for n in NAMES]
    o, S = OPS[backend](*args, x["h0"], chunk_size=4)
    ends = torch.zeros(2, 13, dtype=torch.bool)
    ends[:, -1] = True
    o2, S2 = OPS[backend](*args, x["h0"], chunk_size=4, reset=torch.zeros(2, 13, dtype=torch.bool), ends=ends)
    torch.testing.assert_close(o2, o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S2, S, rtol=1e-12, atol=1e-12)


def test_bad_marks_are_refused_naming_the_shape():
    x = inputs(1, 6, 1, 2, 2)
    with pytest.raises(ValueError, match=r"reset must be a bool \(B, L\) mask of shape \(1, 6\)"):
        gated_delta_chunked(*(x[n] for n in NAMES), reset=torch.zeros(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="ends must be a bool"):
        gated_delta_sequential(*(x[n] for n in NAMES), ends=torch.zeros(1, 6))


def test_packed_chunked_equals_flas_naive_chunk_reference_per_document():
    """fla's ``cu_seqlens`` semantics (each sequence from its own zero state, its own final state) on one
    row of concatenated sequences: our chunked op with ``reset``/``ends`` against fla's naive chunk
    reference run on each sequence (fla's naive references take no ``cu_seqlens``; its chunk kernels
    that do need triton, so on CPU the per-sequence reference is the parity), float32 to 1e-5."""
    pytest.importorskip("einops", reason="fla's naive references need einops: pip install -e 'plugins/zoo-gdn[test]'")
    from zoo_gdn.fla_reference import FlaUnavailableError, load_fla_naive

    try:
        fla = load_fla_naive()
    except FlaUnavailableError as exc:
        pytest.skip(str(exc))
    cu = torch.tensor([0, 7, 8, 27, 40])
    seg = Segments.from_cu_seqlens(cu)
    x = inputs(1, 40, 3, 5, 7, dtype=torch.float32, seed=8)
    o, S = gated_delta_chunked(*(x[n] for n in NAMES), chunk_size=16, reset=seg.starts, ends=end_marks(seg))
    for d, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        q, k, v, beta, g = (x[n][:, a:b] for n in NAMES)
        o_ref, S_ref = fla.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16, scale=1.0, output_final_state=True)
        torch.testing.assert_close(o[:, a:b], o_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(S[d], S_ref[0], rtol=1e-5, atol=1e-5)


# the layer -----------------------------------------------------------------------------------
def layer(backend: str, dtype: torch.dtype = F64, chunk_size: int = 4) -> GatedDeltaNet:
    """Two heads, K 3, V 4, conv width 3 with biases, every parameter moved off its init."""
    torch.manual_seed(0)
    core = GatedDeltaNet(6, num_heads=2, head_dim=3, expand_v=4 / 3, conv_size=3, conv_bias=True,
                         chunk_size=chunk_size, backend=backend, dtype=dtype)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.2 * torch.randn(p.shape, dtype=p.dtype))
    return core.eval()


@pytest.mark.parametrize("backend", OPS)
def test_the_layer_packs_natively_and_without_states(backend):
    """run_packed takes the core's own path (the by-documents fallback would raise), with or without states."""
    seg = layout()
    x = packed_input(seg, 6)
    _, states = assert_matches_solo(layer(backend), x, seg, rtol=1e-10, atol=1e-10)
    assert states is not None and states["ssm"].shape == (seg.num_docs, 2, 3, 4)
    with native_only():
        assert run_packed(layer(backend), x, seg)[1] is None


@pytest.mark.parametrize("backend", OPS)
def test_right_padded_prefill_keeps_each_samples_state(backend):
    """transformers issue 48256: padding holding values ~1e4 never reaches an output or a final state."""
    assert_padded_prefill(layer(backend), 6)


@pytest.mark.parametrize("backend", OPS)
def test_float32_long_packed_rows(backend):
    """L = 300, seven documents (lengths 1 and 2, several crossing chunks of 32, one ending at the row's
    end), float32: outputs and final states equal each document alone to float32 tolerance."""
    seg = long_layout()
    assert_matches_solo(layer(backend, torch.float32, chunk_size=32), packed_input(seg, 6, dtype=torch.float32), seg,
                        rtol=1e-4, atol=1e-5)
