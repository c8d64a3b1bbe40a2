"""S4: HiPPO-LegS in diagonal-plus-low-rank form, one SISO system per channel.

Letters: B batch, L length, H channels (d_model), N state size, M = N/2 stored conjugate pairs.

    continuous   x' = (Λ − PP*) x + B u,   y = C x + D u               Λ, P, B, C ∈ C^(H×M)
    discrete     bilinear with step Δ per channel
    training     K by the Cauchy/Woodbury algorithm from C̃ = C(I − Ā^{l_max}); y = K * u + D u
    streaming    x_t = Ā x_{t−1} + B̄ u_t in O(N) (DPLR half-steps), with C recovered from C̃

C̃ belongs to the kernel length ``l_max`` and to the trained Δ. A longer input, or a rescaled Δ
(``dt_scale``), converts C̃ exactly: C is recovered once (a dense solve) and C̃ rebuilt for the new
length and step. Complex parameters are stored as real (..., 2) views.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.init.diag import log_uniform_dt
from zoo_core.init.hippo import dplr_legs
from zoo_core.kernels.dplr import DPLRStep, c_from_ctilde, ctilde_from_c
from zoo_core.kernels.systems import DPLRSystem
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State, complex_dtype
from zoo_core.stream import DPLRStream

from .params import S4Params

log = logging.getLogger(__name__)


class S4(CoreBase, params=S4Params):
    real_stream = True  # step takes the state's real view too (zoo_core.stream): ONNX export
    ssm_params = ("log_dt", "log_A_real", "A_imag", "P", "B")
    paths = {"conv": ("kernel", "conv")}
    reference = {"kernel": "naive", "conv": "naive"}
    problem = Problem(structure="dplr", lti=True, complex=True)

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_scale: float = 1.0,
        l_max: int = 1024,
        ssm_lr: float | None = 1e-3,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        real = dtype or torch.get_default_dtype()
        H, M = d_model, d_state // 2
        self.d_model, self.d_state, self.l_max = d_model, d_state, l_max
        self.dt_scale, self.ssm_lr = float(dt_scale), ssm_lr
        kw = {"device": device, "dtype": real}
        lam, p, b = (v.expand(H, M).clone() for v in dplr_legs(d_state, dtype=torch.complex128))  # (H, M) each
        log_dt = log_uniform_dt(H, dt_min, dt_max, dtype=torch.float64)  # (H,)
        c = torch.randn(H, M, dtype=torch.complex128)  # (H, M) true readout, complex normal
        ct = ctilde_from_c(DPLRSystem(lam, p, b, c, torch.exp(log_dt)), l_max)  # (H, M) C̃ for l_max
        self.log_dt = nn.Parameter(log_dt.to(**kw))  # (H,)
        self.log_A_real = nn.Parameter(torch.log(-lam.real).to(**kw))  # (H, M)  Re Λ = −exp(·)
        self.A_imag = nn.Parameter(lam.imag.to(**kw).clone())  # (H, M)
        self.P = nn.Parameter(torch.view_as_real(p.contiguous()).to(**kw))  # (H, M, 2)
        self.B = nn.Parameter(torch.view_as_real(b.contiguous()).to(**kw))  # (H, M, 2)
        self.C = nn.Parameter(torch.view_as_real(ct).to(**kw))  # (H, M, 2)  holds C̃
        self.D = nn.Parameter(torch.randn(H, **kw))  # (H,)

    # parameters -> system ----------------------------------------------------------------
    def _trained_system(self) -> DPLRSystem:
        """The system as trained: C̃ for l_max at the trained Δ."""
        lam = torch.complex(-torch.exp(self.log_A_real), self.A_imag)  # (H, M)
        as_c = torch.view_as_complex
        return DPLRSystem(lam, as_c(self.P), as_c(self.B), as_c(self.C), torch.exp(self.log_dt))

    def system(self, length: int) -> tuple[DPLRSystem, int]:
        """The system to run on ``length`` steps and the kernel length its C̃ belongs to."""
        base = self._trained_system()
        if length <= self.l_max and self.dt_scale == 1.0:
            return base, self.l_max
        target = max(length, self.l_max)
        true_c = c_from_ctilde(base, self.l_max)  # (H, M)
        moved = dataclasses.replace(base, C=true_c, dt=base.dt * self.dt_scale)
        return dataclasses.replace(moved, C=ctilde_from_c(moved, target)), target

    @property
    def max_export_length(self) -> int:
        """The longest length the parallel forward exports for (``zoo_core.export.length_bound``): l_max.
        Past it C̃ is converted at the input's length, which does not trace for a symbolic one; up to it
        one kernel at l_max serves every length."""
        return self.l_max

    # sequence --------------------------------------------------------------------------
    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        return self._run(x, state, want_state=False)[0]

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, h = self._run(x, state, want_state=True)
        assert h is not None, "every path returns the final state when asked for it"  # narrows the type
        return y, {"h": h}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents (``zoo_core.packing``), each from the zero state. An FFT convolution cannot
        restart mid-row, so the documents run as one batch right-aligned (zeros before each start):
        an LTI system's zero state stays zero under zero input, so every row reaches its document's
        first step in the zero state and ends in the document's own final state — exact, one kernel
        and one conv call for all documents (C̃ converted once if the longest exceeds ``l_max``)."""
        segments.check(x)
        y, h = self._run(segments.unpack(x, align="right"), None, want_state=with_states)  # (N, L_max, H)
        return segments.pack(y, align="right"), (None if h is None else {"h": h})

    def _run(self, x: Tensor, state: State | None, want_state: bool) -> tuple[Tensor, Tensor | None]:
        L = x.shape[1]
        system, kernel_len = self.system(L)
        # (H, L): the first L taps as a fresh tensor (a slice K[:, :L] is contiguous only where L == kernel_len,
        # a guard that pins an exported length to one side of l_max; the copy is H·L, small beside the kernel)
        K = self.ops.kernel(system, kernel_len).index_select(1, torch.arange(L, device=x.device))
        y = self.ops.conv(x, K.to(x.dtype)) + x * self.D  # (B, L, H)
        h0 = None if state is None else state["h"]
        if h0 is None and not want_state:
            return y, None
        mats = DPLRStep.precompute(system, kernel_len)
        if h0 is not None:  # the free response C Ā^(t+1) h0, step by step with zero input
            zero, h, free = x.new_zeros(x.shape[0], x.shape[2]), h0, []
            for _ in range(L):
                y_t, h = DPLRStep.step(mats, h, zero)
                free.append(y_t)
            y = y + torch.stack(free, 1).to(y.dtype)
        h = h0 if h0 is not None else DPLRStep.init_state(mats, x.shape[0])
        for x_t in x.unbind(1):  # the final state (for chunked streaming), O(N) per step; unbind, not x[:, t]:
            _, h = DPLRStep.step(mats, h, x_t)  # a slice per step would backpropagate L full-size zero tensors
        return y, h

    # streaming -------------------------------------------------------------------------
    def stream(self) -> DPLRStream:
        """The step matrices (C recovered from C̃ by a dense solve) in real arithmetic, cached while the
        parameters are unchanged (``rescale_dt`` forgets them)."""
        return self.cached("stream", lambda: DPLRStream.of(DPLRStep.precompute(*self.system(self.l_max)), self.D))

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (B, H); state {"h": (B, H, M) complex half state, or its real view (B, H, M, 2): the exported form}."""
        y, h = self.stream().step_state(x_t, state["h"])
        return y.to(x_t.dtype), {"h": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        real = dtype or self.D.dtype
        return {"h": torch.zeros(batch_size, self.d_model, self.d_state // 2,
                                 dtype=complex_dtype(real), device=device or self.D.device)}

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_state={self.d_state}, l_max={self.l_max}, backend={self.backend_choice.label()}"
