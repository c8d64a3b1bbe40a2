"""Parity with the ``s5-pytorch`` package (PyPI s5-pytorch 0.2.1, import name ``s5``), a test-only
oracle: ``pip install -e "plugins/zoo-s5[test]"``. It never runs in the zoo itself.

Its semantics differ from the paper (models.md §13.1): no conjugate symmetry (it keeps the full
state, both members of each pair), output Re(C̃x) without the factor 2, one complex Λ parameter,
D ~ U[0, 1). So the parameters are mapped explicitly, each case two ways:

    full   Λ_f = [Λ, Λ̄], B̃_f = [B̃; B̃̄], C̃_f = [C̃, C̃̄], log Δ_f = [log Δ, log Δ]: Re(C̃_f x_f) = 2Re(C̃x)
    half   its state is our P-state and the factor 2 goes into C: C = 2C̃

The recurrences must agree to 1e-5 (float32; it computes in complex64).
"""

from __future__ import annotations

import pytest
import torch

from zoo_s5.core import S5, S5Bidirectional

s5 = pytest.importorskip("s5", reason="test-only oracle: pip install s5-pytorch==0.2.1")
if not hasattr(s5, "S5SSM"):
    pytest.skip("the importable 's5' is not the s5-pytorch package", allow_module_level=True)

TOL = {"rtol": 1e-5, "atol": 1e-5}
H, N = 6, 16


def _ours(cls=S5, **kw):
    torch.manual_seed(0)
    layer = cls(d_model=H, d_state=N, blocks=2, dtype=torch.float32, **kw)
    with torch.no_grad():  # move off the init so the mapping, not a symmetry, makes them agree
        layer.Lambda_re.add_(0.2 * torch.rand_like(layer.Lambda_re) - 0.1)
        layer.log_step.add_(0.5 * torch.rand_like(layer.log_step))
    return layer


def _oracle(ours: S5, mode: str) -> torch.nn.Module:
    """An s5-pytorch S5 holding our parameters; ``mode`` "full" or "half" (see the module doc)."""
    bidir = ours.bidirectional
    lam = ours.Lambda().detach()  # (P,)
    Bt = torch.view_as_complex(ours.B).detach()  # (P, H)
    Cs = [torch.view_as_complex(ours.C).detach()] + ([torch.view_as_complex(ours.C_reverse).detach()] if bidir else [])
    log_step = ours.log_step.detach()  # (P,)
    if mode == "full":
        lam, Bt, log_step = torch.cat([lam, lam.conj()]), torch.cat([Bt, Bt.conj()]), torch.cat([log_step, log_step])
        C = torch.cat([torch.cat([c, c.conj()], -1) for c in Cs], -1)  # (H, N) or (H, 2N)
    else:
        C = torch.cat([2 * c for c in Cs], -1)  # (H, P) or (H, 2P)
    ref = s5.S5(H, lam.shape[0], block_count=1, bidir=bidir)  # shapes only: every parameter is overwritten
    seq = ref.seq
    with torch.no_grad():
        seq.Lambda.copy_(lam)
        seq.B.copy_(torch.view_as_real(Bt))
        seq.C.copy_(C)
        seq.D.copy_(ours.D.detach())
        seq.log_step.copy_(log_step)
    seq.discretize = {"zoh": s5.discretize_zoh, "bilinear": s5.discretize_bilinear}[ours.discretizer]
    return ref


def _expand(h: torch.Tensor, mode: str) -> torch.Tensor:
    return torch.cat([h, h.conj()], -1) if mode == "full" else h


@pytest.mark.parametrize("mode", ["full", "half"])
@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_outputs_and_final_state_match_s5_pytorch(mode, disc):
    ours = _ours(discretizer=disc, dt_scale=1.5)
    ref = _oracle(ours, mode)
    u = torch.randn(3, 97, H)
    with torch.no_grad():
        y, state = ours.forward_with_state(u)
        y_ref, h_ref = ref(u, step_scale=ours.dt_scale, return_state=True)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(_expand(state["h"], mode), h_ref, **TOL)


@pytest.mark.parametrize("mode", ["full", "half"])
def test_carried_state_and_step_match_s5_pytorch(mode):
    ours = _ours()
    ref = _oracle(ours, mode)
    u = torch.randn(2, 40, H)
    with torch.no_grad():
        y1, s1 = ours.forward_with_state(u[:, :15])
        y2, _ = ours.forward_with_state(u[:, 15:], s1)
        _, r1 = ref(u[:, :15], return_state=True)
        r2, _ = ref(u[:, 15:], state=r1, return_state=True)
        torch.testing.assert_close(y2, r2, **TOL)
        # step mode, one sample (its forward_rnn is unbatched and returns Re(C̃x + Du))
        state, h = ours.init_state(1), torch.zeros_like(r1[0])
        for t in range(u.shape[1]):
            y_t, state = ours.step(u[:1, t], state)
            r_t, h = ref.seq.forward_rnn(u[0, t], h)
            torch.testing.assert_close(y_t[0], r_t, **TOL)
        torch.testing.assert_close(_expand(state["h"][0], mode), h, **TOL)


@pytest.mark.parametrize("mode", ["full", "half"])
def test_bidirectional_matches_s5_pytorch(mode):
    ours = _ours(S5Bidirectional, discretizer="zoh")
    ref = _oracle(ours, mode)
    u = torch.randn(2, 33, H)
    with torch.no_grad():
        torch.testing.assert_close(ours(u), ref(u), **TOL)
