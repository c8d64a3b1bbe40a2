"""LRU: the Linear Recurrent Unit, one diagonal complex recurrence for all H features (MIMO).

Letters: B batch, L length, H features (d_model), N complex states (d_state).

    λ   = exp(−exp(ν) + i·exp(θ))          ν, θ ∈ R^N      |λ| = exp(−e^ν) < 1 for any finite ν
    x_t = λ ⊙ x_{t−1} + (γ ⊙ B) u_t        B ∈ C^(N×H),    γ = exp(γ_log) ∈ R^N scales rows of B
    y_t = Re(C x_t) + D ⊙ u_t              C ∈ C^(H×N),    D ∈ R^H

Discrete-time: there is no step size Δ, no factor 2 and no conjugate halving. γ is a trained
parameter (set to sqrt(1 − |λ|²) at init, not recomputed from λ), as in minimal-LRU. Complex
parameters are stored as real tensors with a trailing dimension of 2, so ``.to(dtype)`` and
safetensors see real tensors only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State, complex_dtype
from zoo_core.stream import DiagStream

from .params import LRUParams

F64 = torch.float64
_U_MIN = 1e-12  # u₁ = 0 would give |λ| = 0, ν = +∞ (and u₂ = 0 gives θ_log = −∞)

def ring_init(N: int, r_min: float, r_max: float, max_phase: float) -> tuple[Tensor, Tensor, Tensor]:
    """ν_log, θ_log, γ_log (each (N,), float64) with |λ|² ~ U[r_min², r_max²], arg λ ~ U[0, max_phase].

    1 − |λ|² is formed directly (no cancellation as |λ| → 1); γ_log = log sqrt(1 − |λ|²).
    """
    u1 = torch.rand(N, dtype=F64).clamp_min(_U_MIN)  # (N,)
    u2 = torch.rand(N, dtype=F64).clamp_min(_U_MIN)  # (N,)
    gap = (1 - u1) * (r_max**2 - r_min**2) + (1 - r_max**2)  # (N,) 1 − |λ|², in (0, 1)
    nu_log = torch.log(-0.5 * torch.log1p(-gap))  # (N,) e^ν = −log|λ|
    theta_log = torch.log(max_phase * u2)  # (N,)
    gamma_log = 0.5 * torch.log(gap)  # (N,)
    return nu_log, theta_log, gamma_log


class LRU(CoreBase, params=LRUParams):
    real_stream = True  # step takes the state's real view too (zoo_core.stream): ONNX export
    ssm_params = ("nu_log", "theta_log", "gamma_log", "B")  # minimal-LRU's "ssm" optimiser group
    paths = {"recurrent": ("scan",)}
    reference = {"scan": "naive"}
    problem = Problem(structure="diag", lti=True, complex=True)

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 6.28,
        ssm_lr: float | None = 5e-4,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        real = dtype or torch.get_default_dtype()
        H, N = d_model, d_state
        self.d_model, self.d_state, self.ssm_lr = d_model, d_state, ssm_lr
        self.r_min, self.r_max, self.max_phase = float(r_min), float(r_max), float(max_phase)
        kw = {"device": device, "dtype": real}
        # Drawn in float64 and cast: a float32 and a float64 build with one seed agree.
        nu_log, theta_log, gamma_log = ring_init(N, self.r_min, self.r_max, self.max_phase)
        self.nu_log = nn.Parameter(nu_log.to(**kw))  # (N,)
        self.theta_log = nn.Parameter(theta_log.to(**kw))  # (N,)
        self.gamma_log = nn.Parameter(gamma_log.to(**kw))  # (N,)
        self.B = nn.Parameter((torch.randn(N, H, 2, dtype=F64) / math.sqrt(2 * H)).to(**kw))  # (N, H, 2)
        self.C = nn.Parameter((torch.randn(H, N, 2, dtype=F64) / math.sqrt(N)).to(**kw))  # (H, N, 2)
        self.D = nn.Parameter(torch.randn(H, dtype=F64).to(**kw))  # (H,)

    # parameters -> system ---------------------------------------------------------------
    def lam(self) -> Tensor:
        """λ = exp(−exp(ν) + i·exp(θ)), (N,) complex."""
        return torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))

    def _Bu(self, x: Tensor) -> Tensor:
        """(γ ⊙ B) u for x (..., H) -> (..., N) complex, as two real matmuls."""
        Bn = self.B * torch.exp(self.gamma_log)[:, None, None]  # (N, H, 2)
        x = x.to(Bn.dtype)
        return torch.complex(x @ Bn[..., 0].T, x @ Bn[..., 1].T)  # (..., N)

    def _Cx(self, h: Tensor) -> Tensor:
        """Re(C h) for h (..., N) complex -> (..., H) real."""
        return h.real @ self.C[..., 0].T - h.imag @ self.C[..., 1].T  # (..., H)

    # sequence --------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        h0 = None if state is None else state["h"]  # (B, N)
        bu = self._Bu(x)  # (B, L, N)
        h, h_last = self.ops.scan(self.lam()[None, None], bu, h0)  # (B, L, N)
        y = self._Cx(h) + self.D * x  # (B, L, H)
        return y.to(x.dtype), {"h": h_last}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents (``zoo_core.packing``) in one scan: the scan drops the state at every document
        start (``reset``), so each document runs from zero; its final state is its last step's."""
        segments.check(x)
        h, _ = self.ops.scan(self.lam()[None, None], self._Bu(x), None, reset=segments.starts)  # (B, L, N)
        y = self._Cx(h) + self.D * x  # (B, L, H)
        return y.to(x.dtype), ({"h": segments.at_ends(h)} if with_states else None)

    # streaming -------------------------------------------------------------------------
    def stream(self) -> DiagStream:
        """λ, γ ⊙ B and C in real arithmetic (cached while the parameters are unchanged)."""
        return self.cached("stream", lambda: DiagStream.of(
            self.lam(), self.B * torch.exp(self.gamma_log)[:, None, None], self.C, self.D))  # y = Re(C h) + D x

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (B, H); state {"h": (B, N) complex, or its real view (B, N, 2): the exported form}."""
        y, h = self.stream().step_state(x_t, state["h"])
        return y.to(x_t.dtype), {"h": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        real = dtype or self.D.dtype
        return {"h": torch.zeros(batch_size, self.d_state, dtype=complex_dtype(real), device=device or self.D.device)}

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, r_min={self.r_min}, r_max={self.r_max}, "
                f"max_phase={self.max_phase}, backend={self.backend_choice.label()}")
