"""The Mamba-1 mixer (Gu & Dao 2024), as mamba_ssm's ``Mamba`` and transformers' ``MambaMixer``.

Letters: Bt batch, L length, H model width (d_model), Di = expand·H inner width, N state size,
K conv width, R rank of Δ's projection.

    [x, z]    = in_proj(u)                                  (Bt, L, Di) each
    x         = SiLU(causal depthwise conv1d(x))             left-padded with K−1 past inputs
    [δ, B, C] = x_proj(x)                                   (Bt, L, R), (Bt, L, N), (Bt, L, N)
    Δ         = softplus(dt_proj(δ))                        (Bt, L, Di), bias added before softplus
    h_t       = exp(Δ_t ⊗ A) ⊙ h_{t−1} + (Δ_t ⊙ x_t) ⊗ B_t    A = −exp(A_log), (Di, N)
    y_t       = h_t · C_t + D ⊙ x_t,   y ⊙= SiLU(z),   out = out_proj(y)

B̄ = Δ·B is what every Mamba implementation computes; the paper's zero-order hold
B̄ = (ΔA)⁻¹(exp(ΔA) − I)·ΔB is *not* used, so converted checkpoints behave as trained.
Parameter names equal transformers' ``MambaMixer`` (and mamba_ssm's), so conversion is renaming.
MambaSL's switches: ``tv_dt=False`` gives Δ = softplus(dt_proj.bias) at every step (no
dt_proj.weight); ``tv_B``/``tv_C=False`` replace B/C by learned (Di, N) matrices named ``B``/``C``;
``x_proj`` emits only what is still input-dependent and is absent when nothing is;
``use_D=False`` drops D.

State: ``conv`` (Bt, Di, K−1), the last K−1 inputs of the convolution (mambapy's layout; mamba_ssm
keeps K including the current one), and ``ssm`` (Bt, Di, N) in float32 (float64 for a float64
core).

Packed documents (``forward_packed``, capability ``packing``): one pass over the whole (Bt, L)
batch, as mamba_ssm's ``seq_idx``: the convolution's window is cut at every document start
(``causal_conv_packed``) and the scan's transition is zeroed there (its ``starts``), its states
read at every document's last step (its ``ends``). Padding inputs are zeroed first and no state is
read after a document ends, so right padding never reaches a carried state (the failure of
transformers issue 48256, where Δ on padding kept decaying the prefilled state).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.init.diag import softplus_inverse_dt
from zoo_core.kernels.short_conv import causal_conv, causal_conv_packed, causal_conv_step
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import OptimHint, State
from zoo_core.stream import SelectiveStream

from .params import MambaParams, resolve_rank
from .scan import selective_step


class _Bias(nn.Module):
    """dt_proj without a weight (time-invariant Δ): keeps the checkpoint name ``dt_proj.bias``."""

    def __init__(self, n: int, **kw: Any) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.empty(n, **kw))


class Mamba(CoreBase, params=MambaParams):
    paths = {"selective": ("scan",)}
    reference = {"scan": "selective-naive"}
    problem = Problem(structure="selective", lti=False)
    # Present only when time-invariant (tv_B / tv_C false); declared for the type checker.
    B: nn.Parameter  # (Di, N)
    C: nn.Parameter  # (Di, N)

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: str | int = "auto",
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init: str = "random",
        dt_scale: float = 1.0,
        dt_init_floor: float = 1e-4,
        conv_bias: bool = True,
        bias: bool = False,
        tv_dt: bool = True,
        tv_B: bool = True,
        tv_C: bool = True,
        use_D: bool = True,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        real = dtype or torch.get_default_dtype()
        kw = {"device": device, "dtype": real}
        fp32 = {"device": device, "dtype": torch.promote_types(real, torch.float32)}  # A_log, D: never half
        Di, N, K, R = expand * d_model, d_state, d_conv, resolve_rank(d_model, dt_rank)
        self.d_model, self.d_state, self.d_conv, self.expand, self.d_inner, self.dt_rank = d_model, N, K, expand, Di, R
        self.tv_dt, self.tv_B, self.tv_C, self.use_D = tv_dt, tv_B, tv_C, use_D
        self.in_proj = nn.Linear(d_model, 2 * Di, bias=bias, **kw)
        self.conv1d = nn.Conv1d(Di, Di, K, groups=Di, padding=K - 1, bias=conv_bias, **kw)  # weight (Di, 1, K)
        self._split = [R if tv_dt else 0, N if tv_B else 0, N if tv_C else 0]
        self.x_proj = nn.Linear(Di, sum(self._split), bias=False, **kw) if sum(self._split) else None
        if tv_dt:
            self.dt_proj: nn.Module = nn.Linear(R, Di, bias=True, **kw)
            std = R**-0.5 * dt_scale
            with torch.no_grad():
                if dt_init == "constant":
                    self.dt_proj.weight.fill_(std)
                else:
                    self.dt_proj.weight.uniform_(-std, std)
        else:
            self.dt_proj = _Bias(Di, **kw)
        with torch.no_grad():
            self.dt_proj.bias.copy_(softplus_inverse_dt(Di, dt_min, dt_max, dt_init_floor))
        if not tv_B:
            self.B = nn.Parameter(torch.rand(Di, N, **kw))  # MambaSL: U[0, 1)
        if not tv_C:
            self.C = nn.Parameter(torch.rand(Di, N, **kw))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, **fp32)).repeat(Di, 1))  # (Di, N) S4D-real
        self.D = nn.Parameter(torch.ones(Di, **fp32)) if use_D else None
        self.out_proj = nn.Linear(Di, d_model, bias=bias, **kw)

    # pieces ------------------------------------------------------------------------------
    def _dt_B_C(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Δ (..., Di), and B, C: (..., N) input-dependent or (Di, N), from x (..., Di)."""
        if self.x_proj is None:  # nothing input-dependent: Δ from dt_proj's bias, B and C fixed
            return self._delta(x, x), self.B, self.C
        dt_r, B, C = self.x_proj(x).split(self._split, -1)  # (..., R), (..., N), (..., N); width 0 where fixed
        return self._delta(x, dt_r), B if self.tv_B else self.B, C if self.tv_C else self.C

    def _delta(self, x: Tensor, dt_r: Tensor) -> Tensor:
        """Δ (..., Di): from dt_r (..., R) through dt_proj, or its bias alone when Δ is time-invariant."""
        if isinstance(self.dt_proj, _Bias):
            return F.softplus(self.dt_proj.bias).expand(x.shape)  # (..., Di), the same at every step
        return F.softplus(self.dt_proj(dt_r))  # (..., Di)

    def A(self) -> Tensor:
        return -torch.exp(self.A_log)  # (Di, N)

    def compute_dtype(self) -> torch.dtype:
        """The projections' dtype (a core built in bfloat16 keeps A_log and D in float32 but computes in bfloat16)."""
        return self.in_proj.weight.dtype

    # sequence ----------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """x (Bt, L, H) -> y (Bt, L, H) and the state after the last step."""
        xi, z = self.in_proj(x).chunk(2, dim=-1)  # (Bt, L, Di) each
        xc, past = causal_conv(xi, self.conv1d.weight, self.conv1d.bias, None if state is None else state["conv"])
        u = F.silu(xc)  # (Bt, L, Di)
        delta, B, C = self._dt_B_C(u)
        h0 = None if state is None else state["ssm"]
        y, h = self.ops.selective_scan(u, delta, self.A(), B, C, self.D, h0)  # (Bt, L, Di), (Bt, Di, N)
        out = self.out_proj(y * F.silu(z))  # (Bt, L, H)
        return out, {"conv": past, "ssm": h}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """x (Bt, L, H) packed documents (``zoo_core.packing``) -> y (Bt, L, H) and, with ``with_states``,
        each document's final state (batch N, row-major), every document from the zero state.

        One call over the whole batch, not a loop over documents: the conv window and the scan's
        state restart at every document start. Padding steps give finite outputs of zero input."""
        segments.check(x)
        x = torch.where(segments.valid[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))
        xi, z = self.in_proj(x).chunk(2, dim=-1)  # (Bt, L, Di) each
        xc, pasts = causal_conv_packed(xi, self.conv1d.weight, self.conv1d.bias, segments)  # pasts (N, Di, K−1)
        u = F.silu(xc)  # (Bt, L, Di)
        delta, B, C = self._dt_B_C(u)
        ends = None
        if with_states:
            ends = torch.zeros(segments.shape, dtype=torch.bool, device=x.device)
            ends[segments.doc_row, segments.doc_end] = True
        y, h = self.ops.selective_scan(u, delta, self.A(), B, C, self.D, None, starts=segments.starts, ends=ends)
        out = self.out_proj(y * F.silu(z))  # (Bt, L, H)
        return out, ({"conv": pasts, "ssm": h} if with_states else None)  # h (N, Di, N_state) with ends

    # streaming ---------------------------------------------------------------------------
    def stream(self) -> SelectiveStream:
        """What ``step`` reads that does not change between tokens (A computed once), for the fused
        streaming kernel (``zoo_core.nn.lean``); cached while the parameters are unchanged."""
        def make() -> SelectiveStream:
            dt = self.dt_proj  # nn.Linear(R, Di), or _Bias (a fixed Δ): the bias alone
            return SelectiveStream(
                self.in_proj.weight, self.in_proj.bias, self.conv1d.weight[:, 0], self.conv1d.bias,
                None if self.x_proj is None else self.x_proj.weight, dt.weight if isinstance(dt, nn.Linear) else None,
                cast(Tensor, dt.bias), self.A(), None if self.tv_B else self.B, None if self.tv_C else self.C, self.D,
                self.out_proj.weight, self.out_proj.bias)
        return self.cached("stream", make)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (Bt, H) -> y_t (Bt, H); a constant-size state."""
        xi, z = self.in_proj(x_t).chunk(2, dim=-1)  # (Bt, Di) each
        xc, past = causal_conv_step(xi, self.conv1d.weight, self.conv1d.bias, state["conv"])  # (Bt, Di)
        u = F.silu(xc)
        delta, B, C = self._dt_B_C(u)
        B = B[:, None] if self.tv_B else B  # (Bt, 1, N) | (Di, N)
        C = C[:, None] if self.tv_C else C
        y, h = selective_step(u, delta, self.A(), B, C, self.D, state["ssm"])  # (Bt, Di), (Bt, Di, N)
        return self.out_proj(y * F.silu(z)), {"conv": past, "ssm": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        w = self.in_proj.weight
        dtype, device = dtype or w.dtype, device or w.device
        return {
            "conv": torch.zeros(batch_size, self.d_inner, self.d_conv - 1, device=device, dtype=dtype),
            "ssm": torch.zeros(batch_size, self.d_inner, self.d_state, device=device,
                               dtype=torch.promote_types(dtype, torch.float32)),
        }

    def optim_hints(self) -> Mapping[str, OptimHint]:
        """No weight decay on A_log, D and the time-invariant B, C (mamba_ssm's ``_no_weight_decay``)."""
        hint = OptimHint(weight_decay=0.0)
        return {n: hint for n, _ in self.named_parameters() if n in ("A_log", "D", "B", "C")}

    def extra_repr(self) -> str:
        sl = "" if (self.tv_dt and self.tv_B and self.tv_C and self.use_D) else \
            f", tv_dt={self.tv_dt}, tv_B={self.tv_B}, tv_C={self.tv_C}, use_D={self.use_D}"
        return (f"d_model={self.d_model}, d_inner={self.d_inner}, d_state={self.d_state}, d_conv={self.d_conv}, "
                f"dt_rank={self.dt_rank}{sl}, backend={self.backend_choice.label()}")
