"""Quasi-DEER / Newton for a recurrence ``x_t = F(x_{t−1}, inputs_t)`` whose Jacobian is diagonal.

Letters: B batch, L length, D state size, L' the length of the suffix still being solved.

Newton iteration k (models.md §8.2), with ``prev_t = x^(k)_{t−1}`` (``h0`` first):

    J_t = diag ∂F/∂x (prev_t, u_t),   c_t = F(prev_t, u_t) − J_t ⊙ prev_t
    x^(k+1)_t = J_t ⊙ x^(k+1)_{t−1} + c_t          one diagonal time-varying linear scan

On this lower-triangular system step t is exact once steps < t are, so every iteration fixes at
least one more step. The solver uses that: steps whose change fell below ``tol`` are frozen, and
the next iteration re-solves only the suffix after them, starting from the frozen state. It also
works window by window (W steps, each window from the settled state before it), so at most W
iterations per window, each over at most W steps.

Gradients: converge under ``no_grad``, then ``newton_step`` takes one more step with grad from
the detached fixed point x*. Its J-dependent terms multiply ``x_new − x* ≈ 0``, so its gradients
are the implicit-function gradients of the exact trajectory (what the reference's custom VJP
computes); J itself is detached there, as in that VJP.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo_core.errors import ZooError
from zoo_core.protocols import ScanOp

# (prev (B, L', D), *inputs (B, L', ...)) -> (F, J), both (B, L', D)
StepAndJacobian = Callable[..., tuple[Tensor, Tensor]]
Scan = ScanOp  # a diagonal scan, structure bound: (a, b, h0) -> (h_all, h_last)

CLIP = 1e8  # the reference clips iterates to ±1e8 and replaces NaN by 0 (elk/algs/deer.py)


class NewtonConvergenceError(ZooError, RuntimeError):
    """The Newton iteration did not reach its tolerance within its iteration cap."""

    exit_code = 1


@dataclass(frozen=True)
class NewtonResult:
    """x: (B, L, D) the last iterate; iterations: Newton sweeps in all; max_window_iterations: the
    most spent on one window; windows: how many windows were solved; residual: the last
    max|x^(k+1) − x^(k)|; converged: False when a window hit the iteration cap."""

    x: Tensor
    iterations: int
    max_window_iterations: int
    windows: int
    residual: float
    converged: bool


def default_tol(dtype: torch.dtype) -> float:
    """1e-7 in float64, 1e-4 otherwise (the reference's tolerances)."""
    return 1e-7 if dtype == torch.float64 else 1e-4


def _first_unsettled(change: Tensor, tol: float) -> int:
    """Index of the first step whose change (L',) is ≥ tol (NaN counts as unsettled)."""
    bad = ~(change < tol)  # (L',)
    return int(torch.argmax(bad.to(torch.uint8)))


def newton_fixed_point(
    step_and_jacobian: StepAndJacobian,
    inputs: Sequence[Tensor],
    h0: Tensor,
    *,
    scan: Scan,
    tol: float,
    max_iter: int,
    window: int | None = None,
) -> NewtonResult:
    """Solve the whole trajectory by Newton from a zero initial guess (call under ``no_grad``).

    The sequence is solved window after window ([0, W), [W, 2W), ...), each from the settled
    state before it. Inside a window, a sweep solves the steps from ``start`` (the first one not
    yet settled) to the window's end; a step settles when its change falls below ``tol`` while
    every step before it has settled, and the window is done when a whole sweep changes less
    than ``tol``. ``window=None`` is one window of L steps: the reference's scheme plus the frozen
    prefix. A shorter window keeps each sweep's working set in cache on a CPU.

    Args:
        step_and_jacobian: F and its Jacobian's diagonal, elementwise over (B, L', D).
        inputs: per-step inputs of F, each (B, L, ...); sliced along time.
        h0: (B, D) the state before step 0.
        scan: a zoo_core diagonal scan backend.
        tol: a window has converged when max|x^(k+1) − x^(k)| < tol over it.
        max_iter: cap on the sweeps spent on one window (max_iter ≥ window length always suffices).
        window: window length W (the last one may be shorter), or None for one window of L steps.

    Returns:
        NewtonResult with x (B, L, D).
    """
    B, L = inputs[0].shape[:2]
    W = L if window is None else max(1, window)
    x = h0.new_zeros((B, L) + tuple(h0.shape[1:]))  # (B, L, D): the reference's initial guess
    residual, total, most = math.inf, 0, 0
    for w0 in range(0, L, W):
        start, end, k = w0, min(w0 + W, L), 0
        while start < end:
            if k == max_iter:
                return NewtonResult(x, total, k, w0 // W, residual, False)
            k, total = k + 1, total + 1
            h_start = h0 if start == 0 else x[:, start - 1]  # (B, D) exact: every step before start is settled
            old = x[:, start:end]  # (B, L', D)
            prev = torch.cat([h_start[:, None], old[:, :-1]], 1)  # (B, L', D)
            F, J = step_and_jacobian(prev, *(u[:, start:end] for u in inputs))  # (B, L', D) each
            new, _ = scan(J, F - J * prev, h_start)  # (B, L', D); new_0 = F(h_start)
            new = new.nan_to_num_(nan=0.0, posinf=CLIP, neginf=-CLIP).clamp_(-CLIP, CLIP)
            change = (new - old).abs_().amax(dim=(0, 2))  # (L',)
            x[:, start:end] = new
            residual = float(change.max())
            # new_0 is exact (F of a settled state), so every sweep settles at least one step
            start = end if residual < tol else start + max(_first_unsettled(change, tol), 1)
        most = max(most, k)
    return NewtonResult(x, total, most, -(-L // W), residual, True)


def newton_step(
    step_and_jacobian: StepAndJacobian,
    x_star: Tensor,
    inputs: Sequence[Tensor],
    h0: Tensor,
    *,
    scan: Scan,
    window: int | None = None,
) -> tuple[Tensor, Tensor]:
    """One differentiable Newton step from the fixed point x* (B, L, D), which is detached.

    Gradients reach the parameters and inputs through F and h0 (B, D); the result equals x* to
    within the solver's tolerance. With a window the step is taken window by window, each scan
    starting from the previous window's (differentiable) last state: the same linear recurrence,
    only evaluated in cache-sized pieces. Returns (x (B, L, D), x_last (B, D)).
    """
    L = x_star.shape[1]
    W = L if window is None else max(1, window)
    x_star = x_star.detach()
    h, outs = h0, []
    # split, not slices: one backward node per input instead of a zero-filled (B, L, ...) gradient per window
    pieces = zip(*(u.split(W, 1) for u in inputs), strict=True)
    for s, u_w in zip(range(0, L, W), pieces, strict=True):
        e = min(s + W, L)
        shift = h0 if s == 0 else x_star[:, s - 1]  # (B, D)
        prev = torch.cat([shift[:, None], x_star[:, s:e - 1]], 1)  # (B, W, D)
        F, J = step_and_jacobian(prev, *u_w)  # (B, W, D) each
        J = J.detach()
        # b_0 + J_0 h = F(shift) + J_0 (h − shift): h equals shift in value, and carries the gradient
        y, h = scan(J, F - J * prev, h)  # (B, W, D), (B, D)
        outs.append(y)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, 1)), h
