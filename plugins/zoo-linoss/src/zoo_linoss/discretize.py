"""LinOSS's discretizers: P forced oscillators y'' = −A y + v, with z = y', to 2×2 block steps.

Letters: P oscillators, K any trailing input dimensions of B (e.g. H for LinOSS's (P, H) map).
State per oscillator: [z, y] (velocity first, position second, as the reference code).

    IM    z_n = z_{n−1} + Δ(−A y_n + v_n),      y_n = y_{n−1} + Δ z_n      (implicit Euler)
          M = S [[1, −ΔA], [Δ, 1]],  F = S [Δ, Δ²] v_n,  S = 1/(1 + Δ²A)
    IMEX  z_n = z_{n−1} + Δ(−A y_{n−1} + v_n),  y_n = y_{n−1} + Δ z_n      (symplectic Euler)
          M = [[1, −ΔA], [Δ, 1 − Δ²A]],  F = [Δ, Δ²] v_n

with v_n = (B u_n)_k. Both have the signature of every zoo discretizer,
``(A, B, dt, *, structure="block2x2") -> Discrete(a, b, log_a=None)``:

    A   (P,) real stiffnesses ≥ 0 (the diagonal of A).
    B   (P, *K) real or complex: row k maps the input to oscillator k's forcing.
    dt  step Δ > 0, broadcastable to (P,).
    a   (P, 2, 2) real: the transition M, to be scanned as 2×2 blocks (never diagonalised).
    b   (P, *K, 2): the input map, F_n[k] = Σ b[k, ..., :] u_n; b[..., 0] feeds z, b[..., 1] y.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zoo_core.discretize import Discrete, real_dtype
from zoo_core.errors import ZooError

from .params import DT2A_MAX


class UnstableDiscretizationError(ZooError, ValueError):
    """A discretizer's stability rule (LinOSS-IMEX: Δ²A ≤ 4) is violated."""

    exit_code = 2


def _prepare(A: Tensor, B: Tensor, dt: Tensor | float, structure: str, who: str) -> tuple[Tensor, Tensor, Tensor]:
    """Check shapes; A and dt as (P,) in the common real dtype, B in the common dtype."""
    if structure != "block2x2":
        raise ValueError(f"{who}: unknown structure {structure!r}; allowed: block2x2 "
                         "(one 2×2 block per oscillator; LinOSS has no diagonal or dense form)")
    if A.dim() != 1 or A.is_complex():
        raise ValueError(f"{who}: A must be the real (P,) diagonal of stiffnesses, got {tuple(A.shape)} {A.dtype}")
    if B.dim() < 1 or B.shape[0] != A.shape[0]:
        raise ValueError(f"{who}: B must have shape (P, ...) with P = {A.shape[0]} rows, got {tuple(B.shape)}")
    dtype = torch.promote_types(A.dtype, B.dtype)
    real = real_dtype(dtype)
    dt = torch.broadcast_to(torch.as_tensor(dt, dtype=real, device=A.device), A.shape)  # (P,)
    return A.to(real), B.to(dtype), dt


def _blocks(m11: Tensor, m12: Tensor, m21: Tensor, m22: Tensor) -> Tensor:
    return torch.stack([torch.stack([m11, m12], -1), torch.stack([m21, m22], -1)], -2)  # (P, 2, 2)


def _input_map(B: Tensor, to_z: Tensor, to_y: Tensor) -> Tensor:
    coef = torch.stack([to_z, to_y], -1)  # (P, 2)
    return B[..., None] * coef.view(coef.shape[0], *([1] * (B.dim() - 1)), 2)  # (P, *K, 2)


def linoss_im(A: Tensor, B: Tensor, dt: Tensor | float, *, structure: str = "block2x2") -> Discrete:
    """Implicit Euler on both equations: ``M = S[[1, −ΔA], [Δ, 1]]``, ``F = S[Δ, Δ²]·Bu``.

    ``|eig M| = (1 + Δ²A)^(−1/2) ≤ 1`` for every A ≥ 0: always stable, dissipative.

    Args:
        A: (P,) stiffnesses ≥ 0.
        B: (P, *K) input map rows, real or complex.
        dt: Δ > 0, broadcastable to (P,).
        structure: "block2x2" (the only one).

    Returns:
        ``Discrete(a, b, None)``: a (P, 2, 2) real, b (P, *K, 2).
    """
    A, B, dt = _prepare(A, B, dt, structure, "linoss-im")
    S = 1 / (1 + dt * dt * A)  # (P,) the Schur complement of the implicit system
    a = _blocks(S, -dt * A * S, dt * S, S)  # (P, 2, 2)
    return Discrete(a, _input_map(B, dt * S, dt * dt * S), None)


def linoss_imex(A: Tensor, B: Tensor, dt: Tensor | float, *, structure: str = "block2x2") -> Discrete:
    """Symplectic Euler: ``M = [[1, −ΔA], [Δ, 1 − Δ²A]]``, ``F = [Δ, Δ²]·Bu``.

    ``det M = 1``; both eigenvalues have modulus 1 iff ``Δ²A ≤ 4`` (``dt2A_max``), else one is
    real and above 1 and the state explodes. This function does not check the rule (it would
    cost a host sync); the LinOSS core does, see ``LinOSS.check_stability``.

    Args:
        A: (P,) stiffnesses ≥ 0.
        B: (P, *K) input map rows, real or complex.
        dt: Δ > 0, broadcastable to (P,).
        structure: "block2x2" (the only one).

    Returns:
        ``Discrete(a, b, None)``: a (P, 2, 2) real, b (P, *K, 2).
    """
    A, B, dt = _prepare(A, B, dt, structure, "linoss-imex")
    one = torch.ones_like(A)  # (P,)
    a = _blocks(one, -dt * A, dt, 1 - dt * dt * A)  # (P, 2, 2)
    return Discrete(a, _input_map(B, dt, dt * dt), None)


setattr(linoss_imex, "dt2A_max", DT2A_MAX["linoss-imex"])  # noqa: B010  a function attribute: mypy refuses the plain assignment; read by the core (CoreBase.discretizer_for keeps it)


def check_dt2A(A: Tensor, dt: Tensor, limit: float, who: str) -> float:
    """Raise ``UnstableDiscretizationError`` unless Δ²A ≤ ``limit`` for every oscillator.

    Args:
        A: (P,) stiffnesses; dt: (P,) steps (both detached here).

    Returns:
        max Δ²A over the oscillators.
    """
    with torch.no_grad():
        dt2A = dt.detach() ** 2 * A.detach()  # (P,)
        worst = float(dt2A.max()) if dt2A.numel() else 0.0
        if worst <= limit:  # False for NaN too
            return worst
        bad = torch.nonzero(~(dt2A <= limit)).flatten().tolist()
    shown = ", ".join(f"{k} (Δ²A = {float(dt2A[k]):.4g})" for k in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    raise UnstableDiscretizationError(
        f"{who}: the IMEX (symplectic Euler) step is stable only while Δ²A ≤ {limit:g}, "
        f"but oscillator{'s' if len(bad) > 1 else ''} {shown} exceed{'' if len(bad) > 1 else 's'} it "
        f"(largest {worst if math.isfinite(worst) else float('nan'):.4g}); M would have an eigenvalue "
        f"above 1 and the state would explode. Fix: use discretizer 'linoss-im' (stable for every "
        f"A ≥ 0), lower dt_scale, or keep A_diag ≤ {limit:g}/Δ² (e.g. clamp it after each optimiser step)"
    )
