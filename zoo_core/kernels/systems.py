"""Discrete linear time-invariant systems, as inputs to the kernel ops.

Dimensions:
    H: channels (model width); each channel is an independent single-input single-output system.
    N: state size per channel.
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
