"""S4's Cauchy kernel with the four Cauchy sums fused by pykeops (optional: ``pip install pykeops``).

The maths is ``kernel_cauchy``'s (``dplr.py``): the same nodes 1 ∓ ω, the same conjugate-completed
sums over the stored half, the same division-free Woodbury step (finite at the Nyquist node
ω = −1), then ``irfft``. Only the sums differ: one KeOps reduction over the stored half state,
never materialising an (H, M, F) array. Every complex number is split into its real and imaginary
parts, so the formula is real and its gradients are KeOps' own symbolic derivatives.

Dimensions:
    H: channels (a KeOps batch dimension).
    M: stored half of the state (KeOps j, reduced over).
    F: rfft frequencies, ⌊L/2⌋ + 1 (KeOps i).
    S: the four Cauchy sums (C̃B, C̃P, QB, QP).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

import torch
from torch import Tensor

from .dplr import _cast, _nodes, kernel_cauchy
from .naive import check_length as _check_length
from .systems import DPLRSystem

log = logging.getLogger(__name__)
INSTALL = "pip install 'zoo-core[keops]' (or pip install pykeops)"


def _lazy() -> type:
    """pykeops' LazyTensor class, or ImportError naming the install command."""
    try:
        from pykeops.torch import LazyTensor
    except ImportError as exc:  # also pykeops' own failed imports of its dependencies
        raise ImportError(f"kernel_cauchy_keops needs pykeops: {exc}. Install it with {INSTALL}.") from exc
    return LazyTensor


def _cauchy_sums(v: Tensor, dlam: Tensor, one_m: Tensor, one_p: Tensor) -> Tensor:
    """Σ_m v/den + conj(v)/den', den = 2(1−ω) − (1+ω)Δλ_m, den' the same with conj(Δλ_m).

    With 1/den = g1 − i g2 and 1/den' = h1 − i h2 (all real):
    Re = v_r (g1 + h1) + v_i (g2 − h2) and Im = v_i (g1 − h1) − v_r (g2 + h2).

    Args:
        v: (H, S, M) complex numerators.
        dlam: (H, M) complex Δλ.
        one_m, one_p: (F,) complex 1 − ω and 1 + ω.

    Returns:
        (H, S, F) complex sums.
    """
    LazyTensor = _lazy()
    S = v.shape[1]
    nodes = torch.cat([torch.view_as_real(one_m), torch.view_as_real(one_p)], -1)  # (F, 4)
    w = torch.view_as_real(v.transpose(1, 2))  # (H, M, S, 2)
    z = LazyTensor(nodes[None, :, None, :].contiguous())  # (1, F, 1, 4) i-variable
    d = LazyTensor(torch.view_as_real(dlam)[:, None, :, :].contiguous())  # (H, 1, M, 2) j-variable
    vr = LazyTensor(w[..., 0][:, None].contiguous())  # (H, 1, M, S) j-variable
    vi = LazyTensor(w[..., 1][:, None].contiguous())  # (H, 1, M, S) j-variable
    mr, mi, pr, pi = z[0], z[1], z[2], z[3]
    dr, di = d[0], d[1]
    a, b, c, e = pr * dr, pi * di, pr * di, pi * dr  # products of (1+ω) and Δλ
    den_r, den_i = 2 * mr - a + b, 2 * mi - c - e  # den
    cnj_r, cnj_i = 2 * mr - a - b, 2 * mi + c - e  # den' (conj Δλ)
    inv, inv_c = 1 / (den_r**2 + den_i**2), 1 / (cnj_r**2 + cnj_i**2)
    g1, g2, h1, h2 = den_r * inv, den_i * inv, cnj_r * inv_c, cnj_i * inv_c
    re = vr * (g1 + h1) + vi * (g2 - h2)  # (H, F, M, S) symbolic
    im = vi * (g1 - h1) - vr * (g2 + h2)  # (H, F, M, S) symbolic
    out = re.concat(im).sum(dim=2)  # (H, F, 2S): reduce over the stored half
    return torch.complex(out[..., :S], out[..., S:]).transpose(1, 2)  # (H, S, F)


def kernel_cauchy_keops(system: DPLRSystem, L: int) -> Tensor:
    """``kernel_cauchy`` with the Cauchy sums done by one fused pykeops reduction.

    Same signature, maths and result as ``zoo_core.kernels.dplr.kernel_cauchy``. The first call
    of each dtype JIT-compiles the formula (and each gradient) with the system C++ compiler,
    tens of seconds; later calls use pykeops' cache.

    Args:
        system: ``DPLRSystem`` (Lambda, P, B, C̃: (H, M); dt: (H,)); C̃ belongs to length L.
        L: kernel length, at least 1.

    Returns:
        (H, L) real kernel.
    """
    _check_length(L)
    lam, p, b, c, dt = _cast(system)  # (H, M) ×4, (H)
    v = torch.stack([c * b, c * p, p.conj() * b, p.conj() * p], 1)  # (H, S, M)
    one_m, one_p = _nodes(L, lam.dtype, lam.device)  # (F), (F)
    sums = _cauchy_sums(v, dt[:, None] * lam, one_m, one_p)  # (H, S, F)
    cb, cp, qb, qp = sums.unbind(1)  # (H, F) each
    scale = dt[:, None] * one_p  # (H, F): Δ(1+ω), as in dplr._khat_chunk
    khat = 2 * dt[:, None] * (cb - cp * (scale * qb) / (1 + scale * qp))  # (H, F)
    return torch.fft.irfft(khat, n=L)  # (H, L)


# availability -----------------------------------------------------------------------------------
_CHECKED: list[str | None] = []  # the run-time check's verdict, once per process


def _self_test() -> str | None:
    """Run a tiny keops kernel against ``kernel_cauchy``; None if it agrees, else why not."""
    g = torch.Generator().manual_seed(0)
    H, M, L = 2, 4, 16

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, 2, generator=g)

    lam = torch.view_as_complex(rand(H, M)) - 1  # (H, M)
    lam = torch.complex(-lam.real.abs() - 0.1, lam.imag)  # Re Λ < 0
    p, b, c = (torch.view_as_complex(rand(H, M)) for _ in range(3))  # (H, M) each
    system = DPLRSystem(lam, p, b, c, torch.full((H,), 0.1))
    try:
        got = kernel_cauchy_keops(system, L)
    except Exception as exc:  # noqa: BLE001 — any failure of the third-party JIT is the reason
        return f"pykeops imports but failed its run-time check: {type(exc).__name__}: {exc}"
    want = kernel_cauchy(system, L)
    err = ((got - want).norm() / want.norm()).item()
    if not err <= 1e-4:
        return f"pykeops imports but failed its run-time check: relative error {err:.2e} against kernel_cauchy"
    return None


def runtime_reason() -> str | None:
    """Why pykeops cannot run here (absent, broken import, failed JIT), or None; cached per process."""
    if not _CHECKED:
        if importlib.util.find_spec("pykeops") is None:
            return f"package 'pykeops' is not installed ({INSTALL})"  # cheap, and not cached
        try:
            importlib.import_module("pykeops.torch")
        except Exception as exc:  # noqa: BLE001 — pykeops raises assorted errors on a broken setup
            _CHECKED.append(f"pykeops is installed but its import failed: {type(exc).__name__}: {exc}")
        else:
            _CHECKED.append(_self_test())
        if _CHECKED[0] is not None:
            log.warning("keops kernel backend disabled: %s", _CHECKED[0])
    return _CHECKED[0]

