"""Discrete linear time-invariant systems, as inputs to the kernel ops.

Dimensions:
    H: channels (model width); each channel is an independent single-input single-output system.
    N: state size per channel.
    M: stored half of a conjugate-symmetric state, N/2 (one member of each conjugate pair).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor


@dataclass
class DiagSystem:
    """A diagonal system whose kernel is ``K_l = Re Σ_n w[h, n] · exp(l · log_a[h, n])``.

    Attributes:
        log_a: (H, N) real or complex; log of the discrete eigenvalues ā (``Δλ`` under ZOH).
        w: (H, N) real or complex; output weights, e.g. ``C·B̄`` (or ``2·C·B̄`` when only one of
            each conjugate pair is stored).
    """

    log_a: Tensor  # (H, N)
    w: Tensor  # (H, N)
    structure: ClassVar[str] = "diag"


@dataclass
class DenseSystem:
    """A dense system whose kernel is ``K_l = Re(C Ā^l B̄)``, per channel h.

    Attributes:
        A: (H, N, N) real or complex; discrete state matrix Ā.
        B: (H, N) real or complex; discrete input vector B̄.
        C: (H, N) real or complex; output vector (no conjugation is applied).
    """

    A: Tensor  # (H, N, N)
    B: Tensor  # (H, N)
    C: Tensor  # (H, N)
    structure: ClassVar[str] = "dense"


@dataclass
class DPLRSystem:
    """A continuous DPLR (S4) system, bilinear step Δ, kernel ``K_l = Re(C Ā^l B̄)`` (models.md §2).

    Half storage: the system is the full N = 2M one obtained by conjugate completion,
    ``x_full = [x, conj x]``, so ``Λ_full = [Λ, conj Λ]``, ``P_full = [P, conj P]``, and so on, with
    ``A_full = diag(Λ_full) − P_full P_full*``. That is the paper's ``Λ − P Q*`` with ``Q = P``, the
    state-spaces/s4 code's ``Q = P.conj()`` (its ``Q`` holds the row ``Q*``). Readouts are rows:
    no conjugation is applied to C or C̃.

    Attributes:
        Lambda: (H, M) complex; one member of each conjugate pair of eigenvalues, Re Λ < 0.
        P: (H, M) complex; rank-1 factor.
        B: (H, M) complex; input vector.
        C: (H, M) complex; C̃ = C (I − Ā^L), the learned readout for kernel length L.
        dt: (H,) real; step Δ > 0.
    """

    Lambda: Tensor  # (H, M)
    P: Tensor  # (H, M)
    B: Tensor  # (H, M)
    C: Tensor  # (H, M)
    dt: Tensor  # (H,)
    structure: ClassVar[str] = "dplr"
