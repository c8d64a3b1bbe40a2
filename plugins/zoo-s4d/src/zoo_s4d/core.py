"""S4D: a diagonal SISO state space model per channel.

Letters: B batch, L length, H channels (d_model), N state size, P = N/2 stored conjugate pairs.

    continuous   x'(t) = Λ x(t) + B u(t),   y = 2 Re(C x) + D u       Λ, B, C ∈ C^(H×P)
    discrete     x_t = Ā x_{t−1} + B̄ u_t                              (ZOH / bilinear / Euler)
    convolution  y = K * u + D u,  K_l = 2 Re Σ_p C_p B̄_p Ā_p^l     (Vandermonde kernel, FFT)

Complex parameters are stored as real tensors with a trailing dimension of 2, so ``.to(dtype)``
and safetensors see real tensors only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase, runs_path
from zoo_core.init.diag import S4DInit, log_uniform_dt, s4d_init
from zoo_core.kernels.systems import DiagSystem
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State, complex_dtype
from zoo_core.stream import DiagStream

from .params import S4DParams

_STATE_CHUNK = 1024  # time steps per block when folding a sequence into the final state


class S4D(CoreBase, params=S4DParams):
    real_stream = True  # step takes the state's real view too (zoo_core.stream): ONNX export
    ssm_params = ("log_dt", "log_A_real", "A_imag", "B")
    paths = {"conv": ("kernel", "conv"), "recurrent": ("scan",)}
    reference = {"scan": "naive"}
    problem = Problem(structure="diag", lti=True, complex=True)

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        init: S4DInit = "legs",
        discretizer: str = "zoh",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_scale: float = 1.0,
        ssm_lr: float | None = 1e-3,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        real = dtype or torch.get_default_dtype()
        H, P = d_model, d_state // 2
        self.d_model, self.d_state, self.dt_scale, self.ssm_lr = d_model, d_state, float(dt_scale), ssm_lr
        lam, b = s4d_init(init, H, d_state, dtype=complex_dtype(real))  # (H, P) complex each
        kw = {"device": device, "dtype": real}
        self.log_dt = nn.Parameter(log_uniform_dt(H, dt_min, dt_max, dtype=real).to(device))  # (H,)
        self.log_A_real = nn.Parameter(torch.log(-lam.real).to(**kw))  # (H, P)  Re Λ = −exp(·)
        self.A_imag = nn.Parameter(lam.imag.to(**kw).clone())  # (H, P)
        self.B = nn.Parameter(torch.view_as_real(b).to(**kw))  # (H, P, 2)
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, P, dtype=complex_dtype(real))).to(**kw))  # (H, P, 2)
        self.D = nn.Parameter(torch.randn(H, **kw))  # (H,)
        self.discretizer = discretizer
        self._discretize = self.discretizer_for(discretizer)

    # parameters -> discrete system ------------------------------------------------------
    def _discrete(self) -> Any:
        dt = torch.exp(self.log_dt) * self.dt_scale  # (H,)
        A = torch.complex(-torch.exp(self.log_A_real), self.A_imag)  # (H, P)
        return self._discretize(A, torch.view_as_complex(self.B), dt[:, None])

    def _C(self) -> Tensor:
        return torch.view_as_complex(self.C)  # (H, P)

    # sequence --------------------------------------------------------------------------
    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        return self._run(x, state, want_state=False)[0]

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, h = self._run(x, state, want_state=True)
        assert h is not None, "every path returns the final state when asked for it"  # narrows the type
        return y, {"h": h}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents (``zoo_core.packing``), each from the zero state, in one call of the chosen
        path: the scan restarts at every document start; the convolution runs on the documents
        right-aligned (see ``_convolve``)."""
        segments.check(x)
        y, h = self.run_path(x, self._discrete(), None, with_states, segments)
        return y + x * self.D, ({"h": h} if h is not None else None)

    def _run(self, x: Tensor, state: State | None, want_state: bool) -> tuple[Tensor, Tensor | None]:
        d = self._discrete()
        h0 = None if state is None else state["h"]  # (B, H, P)
        y, h = self.run_path(x, d, h0, want_state)
        return y + x * self.D, h  # (B, L, H)

    @runs_path("conv")
    def _convolve(self, x: Tensor, d: Any, h0: Tensor | None, want_state: bool,
                  segments: Segments | None = None) -> tuple[Tensor, Tensor | None]:
        if segments is not None:
            # An FFT convolution cannot restart mid-row, so packed documents run as one batch of
            # documents right-aligned (zeros before each start): an LTI system's zero state stays zero
            # under zero input, so every row reaches its document's first step in the zero state and
            # ends in its final state (_final_state of the row) — exact, one kernel and one conv call.
            y, h = self._convolve(segments.unpack(x, align="right"), d, None, want_state)  # (N, L_max, H)
            return segments.pack(y, align="right"), h
        L = x.shape[1]
        C = self._C()
        K = self.ops.kernel(DiagSystem(d.log_a, 2 * C * d.b), L)  # (H, L)
        y = self.ops.conv(x, K)  # (B, L, H)
        if h0 is not None:  # y_t += 2 Re Σ_p C_p Ā_p^(t+1) h0_p
            Bsz, H, P = h0.shape
            w = (2 * C * d.a * h0).reshape(Bsz * H, P)  # (B·H, P)
            log_a = d.log_a.expand(Bsz, H, P).reshape(Bsz * H, P)
            y = y + self.ops.kernel(DiagSystem(log_a, w), L).reshape(Bsz, H, L).transpose(1, 2)
        return y, (self._final_state(x, d, h0) if want_state else None)

    def _final_state(self, x: Tensor, d: Any, h0: Tensor | None) -> Tensor:
        """x_L = Ā^L h0 + Σ_s Ā^(L−1−s) B̄ u_s, in blocks of time so memory stays O(H·P·chunk)."""
        L = x.shape[1]
        u = x.to(d.b.dtype)  # (B, L, H) complex
        h = torch.zeros(x.shape[0], *d.b.shape, dtype=d.b.dtype, device=x.device)  # (B, H, P)
        for s0 in range(0, L, _STATE_CHUNK):
            s = torch.arange(s0, min(L, s0 + _STATE_CHUNK), device=x.device)
            power = torch.exp(d.log_a[..., None] * (L - 1 - s).to(d.log_a.real.dtype))  # (H, P, T)
            h = h + torch.einsum("bth,hpt->bhp", u[:, s0:s0 + len(s)], power)
        h = h * d.b
        if h0 is not None:
            h = h + torch.exp(d.log_a * L) * h0
        return h  # (B, H, P)

    @runs_path("recurrent")
    def _recurrent(self, x: Tensor, d: Any, h0: Tensor | None, want_state: bool,
                   segments: Segments | None = None) -> tuple[Tensor, Tensor]:
        bu = d.b * x[..., None].to(d.b.dtype)  # (B, L, H, P)
        if segments is None:
            h, h_last = self.ops.scan(d.a[None, None], bu, h0)  # (B, L, H, P)
        else:  # packed documents: the scan restarts at every document start; each ends at its last step
            h, _ = self.ops.scan(d.a[None, None], bu, None, reset=segments.starts)  # (B, L, H, P)
            h_last = segments.at_ends(h)  # (N, H, P)
        y = 2 * torch.einsum("blhp,hp->blh", h, self._C()).real  # (B, L, H)
        return y.to(x.dtype), h_last

    # streaming -------------------------------------------------------------------------
    def stream(self) -> DiagStream:
        """The discretised system in real arithmetic (cached while the parameters are unchanged)."""
        def make() -> DiagStream:
            d = self._discrete()
            return DiagStream.of(d.a, d.b, 2 * self._C(), self.D)  # y = 2 Re(C h) + D x
        return self.cached("stream", make)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (B, H); state {"h": (B, H, P) complex, or its real view (B, H, P, 2): the exported form}."""
        y, h = self.stream().step_state(x_t, state["h"])
        return y.to(x_t.dtype), {"h": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        real = dtype or self.D.dtype
        return {"h": torch.zeros(batch_size, self.d_model, self.d_state // 2,
                                 dtype=complex_dtype(real), device=device or self.D.device)}

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_state={self.d_state}, discretizer={self.discretizer}, backend={self.backend_choice.label()}"
