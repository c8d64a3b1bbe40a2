"""The Mamba-3 mixer, single-input single-output (Lahoti, Li, Chen, Wang, Bick, Kolter, Dao, Gu 2026), as
mamba_ssm's released ``mamba_ssm.modules.mamba3.Mamba3`` (``is_mimo=False``) defines it, with the
recurrence of its test reference ``mamba3_siso_step_ref``.

Letters: Bt batch, L length, Dm model width (d_model), Di = expand·Dm inner width, H heads,
P = headdim, G groups, N state size, R = rotary angles (⌊N·rope_fraction⌋ rounded down to even, / 2).

    [z, x, B, C, δ, a, λ, θ] = in_proj(u)              Di, Di, G·N, G·N, H, H, H, R
    Δ = softplus(δ + dt_bias) · dt_scale,   A_t = −max(softplus(a), A_floor)   (data-dependent, per head)
    B, C ← RMSNorm_N (per group), repeated to heads, + B_bias, C_bias (H, N)
    Φ_t = Φ_{t−1} + π·tanh(θ_t)·Δ_t  (mod 2π; per head, R angles shared by the heads' rates)
    B, C ← rotate pairs (2r, 2r + 1), r < R, by Φ_t    (the remaining N − 2R states pass unrotated)
    h_t  = e^{Δ_t A_t} h_{t−1} + λ_t Δ_t x_t B_tᵀ + (1 − λ_t) Δ_t e^{Δ_t A_t} x_{t−1} B_{t−1}ᵀ,  λ = sigmoid
    y    = h_t C_t + D x_t;   out = out_proj(y ⊙ SiLU(z))      (outproj_norm: RMSNorm per head, then the gate)

The angle's increment is bounded (π·tanh) and scaled by the step Δ, so at initialisation (Δ ≤ 0.1)
B and C turn slowly: an earlier form (``Mamba3Simple``, outside the release) summed the raw θ and
scrambled B·C across steps, and did not learn recall (benchmarks/tasks/reading/mqar-small.md).
There is no convolution (Mamba-3 drops it). The state carried between calls (and by ``step``): ``ssm``
(Bt, H, P, N), the last step's ``x_prev`` (Bt, H, P) and rotated ``B_prev`` (Bt, H, N) for the
trapezoid's β term, and the cumulative angle ``angle`` (Bt, H, R). Parameter names and shapes equal
the release's (``B_bias``/``C_bias`` (H, 1, N)), so its SISO state dict loads by name.

Packed documents (``forward_packed``, ``zoo_core.packing``) run in one call, every document as a fresh
sequence: the angle is summed within each document only, and the scan's ``reset`` mark drops
the state and the trapezoid's previous-step term at each document start; each document's final state
(``ssm`` from the scan's ``ends``, ``x_prev``, ``B_prev``, ``angle``) is read at its last step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.init.diag import softplus_inverse_dt
from zoo_core.nn.gated_norm import GatedRMSNorm
from zoo_core.packing import Segments
from zoo_core.params import resolve_heads
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import OptimHint, State, require_state_keys

from .params import Mamba3Params
from .scan import TrapScanOp, trap_scan_sequential

TWO_PI = 2 * math.pi


def rotate_pairs(v: Tensor, angle: Tensor) -> Tensor:
    """Rotate the pairs (v_{2r}, v_{2r+1}) by angle_r for r < R: v (..., N), angle (..., R), 2R ≤ N (the
    release's SISO layout, ``rotate_pairwise``); the states past 2R pass unchanged."""
    R = angle.shape[-1]
    pairs = v[..., : 2 * R].unflatten(-1, (R, 2))
    v0, v1 = pairs[..., 0], pairs[..., 1]
    cos, sin = torch.cos(angle).to(v.dtype), torch.sin(angle).to(v.dtype)
    turned = torch.stack([v0 * cos - v1 * sin, v0 * sin + v1 * cos], dim=-1).flatten(-2)
    return torch.cat([turned, v[..., 2 * R:]], dim=-1) if 2 * R < v.shape[-1] else turned


def rope_angles(d_state: int, rope_fraction: float) -> int:
    """R, the number of rotary angles: ⌊N·rope_fraction⌋ rounded down to even, halved (the release's)."""
    split = int(d_state * rope_fraction)
    return (split - split % 2) // 2


def wrap(angle: Tensor) -> Tensor:
    """angle mod 2π, in [0, 2π) (the release keeps its cumulative angle so)."""
    return angle - TWO_PI * torch.floor(angle / TWO_PI)


def wide_dtype(t: Tensor) -> torch.dtype:
    """float64 where the device has it (MPS has none), for sums whose float32 rounding would matter."""
    return t.dtype if t.device.type == "mps" else torch.promote_types(t.dtype, torch.float64)


def cumsum_per_document(v: Tensor, segments: Segments) -> Tensor:
    """Σ_{r ≤ t, r in t's document} v_r for v (Bt, L, ...): the row's cumulative sum minus its value
    just before the document's first step. The two are formed in float64 (where the device has it):
    a float32 difference would lose eps · |row prefix| (6e-5 rad after a prefix of 1e3), while the
    wide one keeps each document's sum as precise as its own cumulative sum alone."""
    wide = wide_dtype(v)
    total = torch.cumsum(v.to(wide), dim=1)  # (Bt, L, ...)
    L = v.shape[1]
    before = torch.arange(L, device=v.device) - segments.position - 1  # (Bt, L): the step before the start, −1 at step 0
    index = before.clamp(min=0).reshape(*before.shape, *([1] * (v.dim() - 2))).expand_as(total)
    prior = torch.where((before >= 0).reshape(index.shape[:2] + (1,) * (v.dim() - 2)), total.gather(1, index),
                        torch.zeros((), dtype=wide, device=v.device))
    return (total - prior).to(v.dtype)


class Mamba3(CoreBase, params=Mamba3Params):
    paths = {"ssd": ("scan",)}
    reference = {"scan": "mamba3-sequential"}
    problem = Problem(structure="mamba3", lti=False)
    # Present only with the matching switch; declared for the type checker.
    B_norm: nn.RMSNorm
    C_norm: nn.RMSNorm
    B_bias: nn.Parameter  # (H, 1, N)
    C_bias: nn.Parameter  # (H, 1, N)
    norm: GatedRMSNorm

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        expand: int = 2,
        headdim: int | None = None,
        nheads: int | None = None,
        ngroups: int = 1,
        rope_fraction: float = 0.5,
        A_floor: float = 1e-4,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_limit_min: float = 0.0,
        dt_limit_max: float | None = None,
        dt_scale: float = 1.0,
        bias: bool = False,
        use_rope: bool = True,
        use_trapezoidal: bool = True,
        use_bc_norm: bool = True,
        use_bc_bias: bool = True,
        outproj_norm: bool = False,
        chunk_size: int = 64,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()  # arguments were validated against Mamba3Params; the backend is bound after
        real = dtype or torch.get_default_dtype()
        kw = {"device": device, "dtype": real}
        fp32 = {"device": device, "dtype": torch.promote_types(real, torch.float32)}  # A_log, D, dt_bias: never half
        Di = expand * d_model
        (H, headdim), N, G = resolve_heads(Di, headdim, nheads), d_state, ngroups
        self.d_model, self.d_state, self.expand, self.d_inner, self.headdim = d_model, N, expand, Di, headdim
        self.nheads, self.ngroups, self.chunk_size, self.dt_scale = H, G, chunk_size, dt_scale
        self.dt_limit = (dt_limit_min, math.inf if dt_limit_max is None else dt_limit_max)
        self.A_floor, self.rope_fraction = A_floor, rope_fraction
        self.use_rope, self.use_trapezoidal = use_rope, use_trapezoidal
        self.use_bc_norm, self.use_bc_bias, self.outproj_norm = use_bc_norm, use_bc_bias, outproj_norm
        self.n_angles = rope_angles(N, rope_fraction) if use_rope else 0
        # the release's order: z, x, B, C, dd_dt, dd_A, trap, angles
        self._split = [Di, Di, G * N, G * N, H, H, H if use_trapezoidal else 0, self.n_angles]
        self.in_proj = nn.Linear(d_model, sum(self._split), bias=bias, **kw)
        self.dt_bias = nn.Parameter(softplus_inverse_dt(H, dt_min, dt_max, dt_init_floor, **fp32))  # softplus⁻¹(Δ₀)
        if use_bc_bias:
            self.B_bias = nn.Parameter(torch.ones(H, 1, N, **kw))
            self.C_bias = nn.Parameter(torch.ones(H, 1, N, **kw))
        if use_bc_norm:
            self.B_norm = nn.RMSNorm(N, eps=1e-5, **kw)
            self.C_norm = nn.RMSNorm(N, eps=1e-5, **kw)
        self.D = nn.Parameter(torch.ones(H, **fp32))
        if outproj_norm:
            self.norm = GatedRMSNorm(Di, headdim, eps=1e-5, norm_before_gate=True, **kw)
        self.out_proj = nn.Linear(Di, d_model, bias=bias, **kw)

    # pieces ------------------------------------------------------------------------------
    def _project(self, u: Tensor, angle0: Tensor | None, segments: Segments | None = None) -> dict[str, Tensor]:
        """Everything the scan needs from u (Bt, L, Dm): z, x (Bt, L, H, P), Δ, A, λ (Bt, L, H),
        rotated B, C (Bt, L, H, N) and the cumulative angle (Bt, L, H, R) continuing angle0, or
        restarting at every document of ``segments``."""
        Bt, L, _ = u.shape
        H, P, N, G = self.nheads, self.headdim, self.d_state, self.ngroups
        z, x, B, C, dt_raw, a_raw, lam_raw, theta = self.in_proj(u).split(self._split, -1)
        dt = F.softplus(dt_raw + self.dt_bias)  # (Bt, L, H), float32 at least (dt_bias is)
        if self.dt_limit != (0.0, math.inf):
            dt = dt.clamp(min=self.dt_limit[0], max=self.dt_limit[1])
        dt = dt * self.dt_scale  # a sampling-rate factor on every Δ (1 in training: the release)
        A = -F.softplus(a_raw.to(dt.dtype)).clamp(min=self.A_floor)  # (Bt, L, H), ≤ −A_floor
        B, C = B.reshape(Bt, L, G, N), C.reshape(Bt, L, G, N)
        if self.use_bc_norm:
            B, C = self.B_norm(B), self.C_norm(C)
        B = B.repeat_interleave(H // G, dim=2)  # (Bt, L, H, N): group g serves heads g·H/G ...
        C = C.repeat_interleave(H // G, dim=2)
        if self.use_bc_bias:
            B, C = B + self.B_bias[:, 0], C + self.C_bias[:, 0]
        out = {"z": z, "x": x.reshape(Bt, L, H, P), "dt": dt, "A": A}
        if self.use_rope:
            # each head turns the R shared angles at its own rate Δ: (Bt, L, H, R)
            step = math.pi * torch.tanh(theta.to(dt.dtype))[:, :, None, :] * dt[..., None]
            if segments is not None:
                angle = cumsum_per_document(step, segments)
            else:
                wide = wide_dtype(step)
                angle = torch.cumsum(step.to(wide), dim=1)  # summed wide: exact over long streams, then wrapped
                if angle0 is not None:
                    angle = angle + angle0[:, None].to(wide)
            angle = wrap(angle).to(step.dtype)
            B, C = rotate_pairs(B, angle), rotate_pairs(C, angle)
            out["angle"] = angle
        out["B"], out["C"] = B, C
        if self.use_trapezoidal:
            out["lam"] = torch.sigmoid(lam_raw)
        return out

    def _run(self, u: Tensor, state: State | None, scan: TrapScanOp) -> tuple[Tensor, State]:
        """u (Bt, L, Dm) through ``scan``, continuing ``state``; the output and the state after."""
        Bt, L, _ = u.shape
        if state is not None:
            require_state_keys("Mamba3", state, self._state_parts(),
                               f"use_trapezoidal={self.use_trapezoidal}, use_rope={self.use_rope}")
        if L == 0:
            return u.new_zeros(Bt, 0, self.d_model), (self.init_state(Bt, device=u.device, dtype=u.dtype)
                                                      if state is None else dict(state))
        p = self._project(u, None if state is None else state.get("angle"))
        x_prev = B_prev = h0 = None
        if state is not None:
            h0, x_prev, B_prev = state["ssm"], state.get("x_prev"), state.get("B_prev")
        y, h = scan(p["x"], p["dt"], p["A"], p["B"], p["C"], p.get("lam"), h0, x_prev, B_prev,
                    chunk_size=self.chunk_size)
        return self._output(u, y, p), self._state_after(h, p, lambda t: t[:, -1])

    def _output(self, u: Tensor, y: Tensor, p: Mapping[str, Tensor]) -> Tensor:
        """The scan's y (Bt, L, H, P) -> out (Bt, L, Dm): the D skip, the SiLU(z) gate (after a per-head
        RMSNorm with outproj_norm), out_proj."""
        Bt, L, _ = u.shape
        y = (y + p["x"] * self.D[:, None]).reshape(Bt, L, self.d_inner)  # (Bt, L, Di), float32 at least
        if self.outproj_norm:
            y = self.norm(y, p["z"])
        else:
            y = y * F.silu(p["z"].to(y.dtype))
        return cast(Tensor, self.out_proj(y.to(u.dtype)))

    def _state_after(self, h: Tensor, p: Mapping[str, Tensor], last: Callable[[Tensor], Tensor]) -> State:
        """The state after a sequence's last step (``last`` picks it: the final step, or each document's)."""
        new: State = {"ssm": h}
        if self.use_trapezoidal:
            new["x_prev"], new["B_prev"] = last(p["x"]).to(h.dtype), last(p["B"]).to(h.dtype)
        if self.use_rope:
            new["angle"] = last(p["angle"]).to(h.dtype)
        return new

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents x (Bt, L, Dm) laid out by ``segments``, each a fresh sequence, in one call:
        y (Bt, L, Dm) and each document's final state (batch N, the parts ``forward_with_state`` returns).

        On padding steps the scan sees Δ = 0 and x = 0 (transformers issue 48256: an unmasked Δ on right
        padding corrupted the carried state; B and C are normed, so bounded): whatever the padding
        holds, it neither moves a state nor reaches a document's numbers."""
        segments.check(x)
        p = self._project(x, None, segments)
        valid = segments.valid[..., None]  # (Bt, L, 1)
        p["dt"] = torch.where(valid, p["dt"], torch.zeros((), dtype=p["dt"].dtype, device=x.device))
        p["x"] = torch.where(valid[..., None], p["x"], torch.zeros((), dtype=p["x"].dtype, device=x.device))
        ends = None
        if with_states:
            ends = torch.zeros(segments.shape, dtype=torch.bool, device=x.device)
            ends[segments.doc_row, segments.doc_end] = True  # (Bt, L)
        scan = cast(TrapScanOp, self.ops.scan)
        y, h = scan(p["x"], p["dt"], p["A"], p["B"], p["C"], p.get("lam"), chunk_size=self.chunk_size,
                    reset=segments.starts, ends=ends)
        return self._output(x, y, p), (self._state_after(h, p, segments.at_ends) if with_states else None)

    # sequence and streaming ----------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """x (Bt, L, Dm) -> y (Bt, L, Dm) and the state after the last step."""
        return self._run(x, state, cast(TrapScanOp, self.ops.scan))

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (Bt, Dm) -> y_t (Bt, Dm): one update of the recurrence, whatever the backend."""
        y, new = self._run(x_t[:, None], state, trap_scan_sequential)
        return y[:, 0], new

    def _state_parts(self) -> dict[str, str]:
        """Every part a carried state must hold in this configuration: without x_prev/B_prev or
        angle the continuation would silently drop the trapezoid's β term or restart the rotary."""
        parts = {"ssm": "(B, H, P, N)"}
        if self.use_trapezoidal:
            parts.update(x_prev="(B, H, P)", B_prev="(B, H, N)")
        if self.use_rope:
            parts["angle"] = "(B, H, R)"
        return parts

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        w = self.in_proj.weight
        device = device or w.device
        dt = torch.promote_types(dtype or w.dtype, torch.float32)
        H, P, N = self.nheads, self.headdim, self.d_state
        state: State = {"ssm": torch.zeros(batch_size, H, P, N, device=device, dtype=dt)}
        if self.use_trapezoidal:
            state["x_prev"] = torch.zeros(batch_size, H, P, device=device, dtype=dt)
            state["B_prev"] = torch.zeros(batch_size, H, N, device=device, dtype=dt)
        if self.use_rope:
            state["angle"] = torch.zeros(batch_size, H, self.n_angles, device=device, dtype=dt)
        return state

    def optim_hints(self) -> Mapping[str, OptimHint]:
        """No weight decay on dt_bias and D (the release's ``_no_weight_decay``)."""
        hint = OptimHint(weight_decay=0.0)
        return {n: hint for n, _ in self.named_parameters() if n in ("dt_bias", "D")}

    def extra_repr(self) -> str:
        off = [k for k in ("use_rope", "use_trapezoidal", "use_bc_norm", "use_bc_bias") if not getattr(self, k)]
        return (f"d_model={self.d_model}, d_inner={self.d_inner}, heads={self.nheads}×{self.headdim}, "
                f"d_state={self.d_state}, angles={self.n_angles}, ngroups={self.ngroups}, chunk_size={self.chunk_size}"
                + (", outproj_norm=True" if self.outproj_norm else "")
                + "".join(f", {k}=False" for k in off) + f", backend={self.backend_choice.label()}")
