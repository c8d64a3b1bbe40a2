"""The Mamba-2 mixer (Dao & Gu 2024), as mamba_ssm's ``Mamba2`` and transformers' ``Mamba2Mixer``.

Letters: Bt batch, L length, H model width (d_model), Di = expand·H inner width, Hh heads,
P = Di/Hh head_dim, G groups, N state size, K conv width, Dc = Di + 2·G·N conv channels.

    [z, xBC, dt] = in_proj(u)                           (Bt, L, Di), (Bt, L, Dc), (Bt, L, Hh)
    [x, B, C]    = SiLU(causal depthwise conv1d(xBC))   left-padded with K−1 past inputs
    Δ            = clamp(softplus(dt + dt_bias), dt_limit) · dt_scale      (Bt, L, Hh)
    H_t          = exp(Δ_t A) H_{t−1} + Δ_t x_t ⊗ B_t   per head, A = −exp(A_log) a scalar
    y_t          = H_t C_t + D ⊙ x_t                    D per head
    out          = out_proj(RMSNorm_G(y ⊙ SiLU(z)))      or RMSNorm_G(y) ⊙ SiLU(z) (norm_before_gate)

The scan is the op ``scan`` for structure ``ssd`` (``zoo_mamba2.ssd``): ``ssd-chunked`` (the chunked
SSD algorithm) or ``ssd-sequential`` (the recurrence, the reference). Parameter names equal
transformers' ``Mamba2Mixer`` and mamba_ssm's ``Mamba2``, so conversion renames prefixes only.

State: ``conv`` (Bt, Dc, K−1), the last K−1 inputs of the convolution, and ``ssm`` (Bt, Hh, P, N)
in float32 (float64 for a float64 core). The SSM runs in that precision too, as the references do.

Packed documents (``forward_packed``, ``zoo_core.packing``): the convolution's window is cut at every
document start (``causal_conv_packed``) and the scan's transition zeroed there (its ``reset`` mark,
mamba_ssm's ``seq_idx``), in one call over the whole packed batch; each document's final state is
read at its last step (the scan's ``ends``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.init.diag import softplus_inverse_dt
from zoo_core.kernels.short_conv import causal_conv, causal_conv_packed, causal_conv_step
from zoo_core.nn.gated_norm import GatedRMSNorm
from zoo_core.packing import Segments
from zoo_core.params import resolve_heads
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import OptimHint, State, require_state_keys

from .params import Mamba2Params
from .ssd import SSDOp, ssd_step

_STATE_PARTS = {"conv": "(B, Di + 2·G·N, d_conv − 1)", "ssm": "(B, heads, head_dim, d_state)"}


class Mamba2(CoreBase, params=Mamba2Params):
    paths = {"ssd": ("scan",)}
    reference = {"scan": "ssd-sequential"}
    problem = Problem(structure="ssd", lti=False)

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        d_conv: int = 4,
        expand: int = 2,
        head_dim: int | None = None,
        n_heads: int | None = None,
        n_groups: int = 1,
        chunk_size: int = 256,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_limit_min: float = 0.0,
        dt_limit_max: float | None = None,
        dt_scale: float = 1.0,
        A_init_min: float = 1.0,
        A_init_max: float = 16.0,
        rmsnorm: bool = True,
        norm_before_gate: bool = False,
        norm_eps: float = 1e-5,
        conv_bias: bool = True,
        bias: bool = False,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        real = dtype or torch.get_default_dtype()
        kw = {"device": device, "dtype": real}
        fp32 = {"device": device, "dtype": torch.promote_types(real, torch.float32)}  # A_log, D, dt_bias: never half
        Di = expand * d_model
        Hh, P = resolve_heads(Di, head_dim, n_heads)
        G, N, K = n_groups, d_state, d_conv
        self.d_model, self.d_inner, self.n_heads, self.head_dim, self.n_groups = d_model, Di, Hh, P, G
        self.d_state, self.d_conv, self.chunk_size, self.conv_dim = N, K, chunk_size, Di + 2 * G * N
        self.dt_limit = (dt_limit_min, math.inf if dt_limit_max is None else dt_limit_max)
        self.dt_scale = float(dt_scale)
        self.in_proj = nn.Linear(d_model, Di + self.conv_dim + Hh, bias=bias, **kw)  # [z, x, B, C, dt]
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, K, groups=self.conv_dim, padding=K - 1,
                                bias=conv_bias, **kw)  # weight (Dc, 1, K)
        self.dt_bias = nn.Parameter(softplus_inverse_dt(Hh, dt_min, dt_max, dt_init_floor).to(**fp32))  # (Hh,)
        A = torch.empty(Hh, **fp32).uniform_(A_init_min, A_init_max)
        self.A_log = nn.Parameter(torch.log(A))  # (Hh,)
        self.D = nn.Parameter(torch.ones(Hh, **fp32))  # (Hh,)
        self.norm = GatedRMSNorm(Di, Di // G, norm_eps, norm_before_gate, **kw) if rmsnorm else None
        self.out_proj = nn.Linear(Di, d_model, bias=bias, **kw)

    # pieces ------------------------------------------------------------------------------
    def _split(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """in_proj's output (..., ·) -> z (..., Di), xBC (..., Dc), dt (..., Hh)."""
        z, xbc, dt = zxbcdt.split([self.d_inner, self.conv_dim, self.n_heads], dim=-1)
        return z, xbc, dt

    def _ssm_inputs(self, xbc: Tensor, dt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """After the conv and SiLU, xbc (..., Dc) and dt (..., Hh) -> x (..., Hh, P), Δ (..., Hh),
        A (Hh,), B, C (..., G, N), all in the SSM's precision (float32 at least)."""
        work = self.A_log.dtype
        x, B, C = xbc.to(work).split([self.d_inner, self.n_groups * self.d_state, self.n_groups * self.d_state], -1)
        delta = F.softplus(dt.to(work) + self.dt_bias).clamp(*self.dt_limit) * self.dt_scale
        x = x.unflatten(-1, (self.n_heads, self.head_dim))
        B, C = B.unflatten(-1, (self.n_groups, self.d_state)), C.unflatten(-1, (self.n_groups, self.d_state))
        return x, delta, -torch.exp(self.A_log), B, C

    def _output(self, y: Tensor, x: Tensor, z: Tensor) -> Tensor:
        """y, x (..., Hh, P), z (..., Di) -> out (..., H): the D skip, the gate and norm, out_proj."""
        y = (y + x * self.D[:, None]).flatten(-2)  # (..., Di)
        g = self.norm(y, z) if self.norm is not None else y * F.silu(z.to(y.dtype))
        return cast(Tensor, self.out_proj(g.to(self.out_proj.weight.dtype)))

    def compute_dtype(self) -> torch.dtype:
        """The projections' dtype (a core built in bfloat16 keeps A_log and D in float32 but computes in bfloat16)."""
        return self.in_proj.weight.dtype

    # sequence ----------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """x (Bt, L, H) -> y (Bt, L, H) and the state after the last step."""
        Bt, L, _ = x.shape
        if state is not None:
            require_state_keys("Mamba2", state, _STATE_PARTS)
        if L == 0:  # nothing to convolve (conv1d refuses an input shorter than its kernel): the state passes through
            return x.new_zeros(Bt, 0, self.d_model), (self.init_state(Bt, device=x.device, dtype=x.dtype)
                                                      if state is None else dict(state))
        z, xbc, dt = self._split(self.in_proj(x))
        # channels_last: conv1d's CPU backward is ~10× faster on that layout (see causal_conv)
        xc, past = causal_conv(xbc, self.conv1d.weight, self.conv1d.bias, None if state is None else state["conv"],
                               channels_last=True)  # (Bt, L, Dc)
        xs, delta, A, B, C = self._ssm_inputs(F.silu(xc), dt)
        h0 = None if state is None else state["ssm"]
        scan = cast(SSDOp, self.ops.scan)  # ScanOp's name, SSD's signature (structure "ssd")
        y, h = scan(xs, delta, A, B, C, self.chunk_size, h0)  # (Bt, L, Hh, P), (Bt, Hh, P, N)
        return self._output(y, xs, z), {"conv": past, "ssm": h}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents x (Bt, L, H) laid out by ``segments``, each from the zero state, in one call:
        y (Bt, L, H) and each document's final state (``conv`` (N, Dc, K−1), ``ssm`` (N, Hh, P, N)).

        On padding steps the scan sees Δ = 0 and x = B = C = 0 (transformers issue 48256: an unmasked Δ
        on right padding corrupted the carried state): whatever the padding holds, it neither moves a
        state nor reaches a document's numbers, not even as 0 · inf in the chunk matmuls."""
        segments.check(x)
        z, xbc, dt = self._split(self.in_proj(x))
        xc, pasts = causal_conv_packed(xbc, self.conv1d.weight, self.conv1d.bias, segments)  # (Bt, L, Dc), (N, Dc, K−1)
        valid = segments.valid[..., None]  # (Bt, L, 1)
        zero = torch.zeros((), dtype=xc.dtype, device=xc.device)
        xs, delta, A, B, C = self._ssm_inputs(torch.where(valid, F.silu(xc), zero), dt)
        delta = torch.where(valid, delta, torch.zeros((), dtype=delta.dtype, device=delta.device))
        ends = None
        if with_states:
            ends = torch.zeros(segments.shape, dtype=torch.bool, device=x.device)
            ends[segments.doc_row, segments.doc_end] = True  # (Bt, L)
        scan = cast(SSDOp, self.ops.scan)
        y, h = scan(xs, delta, A, B, C, self.chunk_size, None, reset=segments.starts, ends=ends)
        return self._output(y, xs, z), ({"conv": pasts, "ssm": h} if with_states else None)

    # streaming ---------------------------------------------------------------------------
    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (Bt, H) -> y_t (Bt, H); a constant-size state."""
        require_state_keys("Mamba2", state, _STATE_PARTS)
        z, xbc, dt = self._split(self.in_proj(x_t))
        conv, past = causal_conv_step(xbc, self.conv1d.weight, self.conv1d.bias, state["conv"])  # (Bt, Dc)
        xs, delta, A, B, C = self._ssm_inputs(F.silu(conv), dt)
        y, h = ssd_step(xs, delta, A, B, C, state["ssm"].to(xs.dtype))  # (Bt, Hh, P), (Bt, Hh, P, N)
        return self._output(y, xs, z), {"conv": past, "ssm": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        w = self.in_proj.weight
        dtype, device = dtype or w.dtype, device or w.device
        return {
            "conv": torch.zeros(batch_size, self.conv_dim, self.d_conv - 1, device=device, dtype=dtype),
            "ssm": torch.zeros(batch_size, self.n_heads, self.head_dim, self.d_state, device=device,
                               dtype=torch.promote_types(dtype, torch.float32)),
        }

    def optim_hints(self) -> Mapping[str, OptimHint]:
        """No weight decay on A_log, D and dt_bias (mamba_ssm's ``_no_weight_decay``)."""
        hint = OptimHint(weight_decay=0.0)
        return {n: hint for n in ("A_log", "D", "dt_bias")}

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_inner={self.d_inner}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"n_groups={self.n_groups}, d_state={self.d_state}, d_conv={self.d_conv}, chunk_size={self.chunk_size}, "
                f"backend={self.backend_choice.label()}")
