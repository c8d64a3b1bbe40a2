"""S5: one MIMO diagonal state space model for all H features (models.md §5).

Letters: B batch, L length, H features (d_model), N state size (d_state), P = N/2 stored
conjugate pairs.

    continuous   x'(t) = Λ x(t) + B̃ u(t),   y = 2 Re(C̃ x) + D ⊙ u       Λ (P), B̃ (P×H), C̃ (H×P)
    discrete     x_t = Λ̄ ⊙ x_{t−1} + B̄ u_t,  Λ̄, B̄ from (Λ, B̃, Δ) per state   (ZOH / bilinear)
    reverse      x^r_t = Λ̄ ⊙ x^r_{t+1} + B̄ u_t;  y_t += 2 Re(C̃₂ x^r_t)       (S5Bidirectional)

Only one of each conjugate pair is stored; the full N-state system is [x, x̄] with readout
[C̃, C̃̄], whose output is Re(C̃x + C̃̄x̄) = 2 Re(C̃x). Complex parameters are real tensors with a
trailing dimension of 2, so ``.to(dtype)`` and safetensors see real tensors only.

No convolution path: the MIMO kernel K_l = 2 Re(C̃ diag(Λ̄^l) B̄) is H×H per lag, so building it
costs H²·P·L (vs the scan's 2·H·P·L per sequence) and the FFT product B·H²·L: slower at every L.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.errors import NotCausalError  # re-exported: raised by this core's refusals
from zoo_core.init.diag import log_uniform_dt
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State, complex_dtype
from zoo_core.stream import DiagStream

from .init import block_hippo_n, init_B_tilde, init_C_tilde
from .params import S5BidirectionalParams, S5Params

CLIP = -1e-4  # clip_eigs: Re Λ ≤ −1e-4 keeps ZOH's (Λ̄ − 1)/Λ finite and |Λ̄| < 1


def _project(x: Tensor, w: Tensor) -> Tensor:
    """x @ wᵀ for real x (..., K) and complex w (M, K): two real matmuls, (..., M) complex."""
    x = x.to(w.real.dtype)
    return torch.complex(x @ w.real.T, x @ w.imag.T)


def _readout(h: Tensor, C: Tensor) -> Tensor:
    """2 Re(C h) for complex h (..., P) and C (H, P): (..., H) real."""
    return 2 * (h.real @ C.real.T - h.imag @ C.imag.T)


class S5(CoreBase, params=S5Params):
    """Causal S5: streams with ``step`` and carries ``{"h": (B, P) complex}`` between chunks."""
    real_stream = True  # step takes the state's real view too (zoo_core.stream): ONNX export

    ssm_params = ("Lambda_re", "Lambda_im", "B", "log_step")
    paths = {"recurrent": ("scan",)}
    reference = {"scan": "naive"}
    problem = Problem(structure="diag", lti=True, complex=True)
    bidirectional: ClassVar[bool] = False

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        blocks: int = 8,
        c_init: str = "trunc_standard_normal",
        discretizer: str = "zoh",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_scale: float = 1.0,
        clip_eigs: bool = False,
        ssm_lr: float | None = 1e-3,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        real = dtype or torch.get_default_dtype()
        kw = {"device": device, "dtype": real}
        H, P = d_model, d_state // 2
        self.d_model, self.d_state, self.blocks, self.c_init = d_model, d_state, blocks, c_init
        self.dt_scale, self.clip_eigs, self.ssm_lr = float(dt_scale), bool(clip_eigs), ssm_lr
        lam, V = block_hippo_n(d_state, blocks)  # (P,), (N, P) complex128
        self.Lambda_re = nn.Parameter(lam.real.to(**kw))  # (P,)
        self.Lambda_im = nn.Parameter(lam.imag.to(**kw))  # (P,)
        self.B = nn.Parameter(torch.view_as_real(init_B_tilde(V, H)).to(**kw))  # (P, H, 2): B̃
        self.C = nn.Parameter(torch.view_as_real(init_C_tilde(c_init, V, H)).to(**kw))  # (H, P, 2): C̃
        if self.bidirectional:
            self.C_reverse = nn.Parameter(torch.view_as_real(init_C_tilde(c_init, V, H)).to(**kw))  # (H, P, 2)
        self.D = nn.Parameter(torch.randn(H, dtype=torch.float64).to(**kw))  # (H,)
        self.log_step = nn.Parameter(log_uniform_dt(P, dt_min, dt_max, dtype=real).to(device))  # (P,)
        self.discretizer = discretizer
        self._discretize = self.discretizer_for(discretizer)

    # parameters -> discrete system ------------------------------------------------------
    def Lambda(self) -> Tensor:
        """Continuous eigenvalues Λ (P,) complex, clipped into Re ≤ −1e-4 when ``clip_eigs``."""
        re = self.Lambda_re.clamp(max=CLIP) if self.clip_eigs else self.Lambda_re
        return torch.complex(re, self.Lambda_im)

    def step_sizes(self) -> Tensor:
        """Δ (P,) = dt_scale · exp(log_step): one step per state."""
        return torch.exp(self.log_step) * self.dt_scale

    def discrete(self) -> tuple[Tensor, Tensor]:
        """(Λ̄ (P,), B̄ (P, H)) through the registered discretizer.

        Every diagonal discretizer is linear in B (B̄ = g(Λ, Δ)·B̃ per state), so it runs on a
        column of ones and g scales B̃; Λ̄ and g are computed once per state, not per feature.
        """
        lam = self.Lambda()[:, None]  # (P, 1)
        d = self._discretize(lam, torch.ones_like(lam), self.step_sizes()[:, None])
        return d.a[:, 0], d.b * torch.view_as_complex(self.B)  # (P,), (P, H)

    # sequence --------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        y, _, h = self._run(x, state)
        return y, {"h": h}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents (``zoo_core.packing``) in one scan with ``reset`` at every document start;
        each final state is the document's last step. (Bidirectional: ``_run`` also reverses time
        inside each document for the second scan.)"""
        segments.check(x)
        y, h, _ = self._run(x, None, segments)
        return y, ({"h": segments.at_ends(h)} if with_states else None)

    def _run(self, x: Tensor, state: State | None, segments: Segments | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(outputs (B, L, H), every state (B, L, P), final state (B, P)). With ``segments`` (packed
        documents, no incoming state) both scans restart at every document start, and the reverse
        one runs on time reversed inside each document (``segments.reverse``) instead of the whole row,
        so no document sees its neighbour and padding (left in place) never reaches a valid step."""
        a, b = self.discrete()  # (P,), (P, H)
        bu = _project(x, b)  # (B, L, P)
        scan = self.ops.scan if segments is None else functools.partial(self.ops.scan, reset=segments.starts)
        h, h_last = scan(a, bu, None if state is None else state["h"])  # (B, L, P), (B, P)
        y = _readout(h, torch.view_as_complex(self.C))  # (B, L, H)
        if self.bidirectional:
            flip: Callable[[Tensor], Tensor] = (lambda t: t.flip(1)) if segments is None else segments.reverse
            h_rev, _ = scan(a, flip(bu), None)  # (B, L, P) in reversed time
            y = y + _readout(flip(h_rev), torch.view_as_complex(self.C_reverse))
        return (y + x * self.D).to(x.dtype), h, h_last

    # streaming -------------------------------------------------------------------------
    def stream(self) -> DiagStream:
        """The discretised system in real arithmetic (cached while the parameters are unchanged)."""
        def make() -> DiagStream:
            a, b = self.discrete()
            return DiagStream.of(a, b, 2 * torch.view_as_complex(self.C), self.D)  # y = 2 Re(C h) + D x
        return self.cached("stream", make)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """x_t (B, H); state {"h": (B, P) complex, or its real view (B, P, 2): the exported form}."""
        y, h = self.stream().step_state(x_t, state["h"])
        return y.to(x_t.dtype), {"h": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        real = dtype or self.D.dtype
        return {"h": torch.zeros(batch_size, self.d_state // 2, dtype=complex_dtype(real),
                                 device=device or self.D.device)}

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, blocks={self.blocks}, c_init={self.c_init}, "
                f"discretizer={self.discretizer}, backend={self.backend_choice.label()}")


class S5Bidirectional(S5, params=S5BidirectionalParams):
    """S5 with a second, reverse-time scan (shared Λ̄, B̄; own readout ``C_reverse``).

    The output at t depends on inputs after t, so there is no causal streaming mode: ``step`` and
    ``init_state`` raise ``NotCausalError``, and ``forward_with_state`` accepts no incoming state
    (it returns an empty one: nothing can be carried into a later chunk).
    """

    bidirectional: ClassVar[bool] = True

    def _refuse(self, what: str) -> NotCausalError:
        return NotCausalError(
            f"s5-bidirectional cannot {what}: its reverse-time scan makes y_t depend on inputs "
            "after t, so there is no causal step or carried state; run whole sequences with "
            "forward(), or use the causal core 's5' for streaming"
        )

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        if state is not None:
            raise self._refuse("continue from a carried state")
        return self._run(x, None)[0], {}

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        segments.check(x)
        return self._run(x, None, segments)[0], ({} if with_states else None)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        raise self._refuse("step one token at a time")

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        raise self._refuse("stream (init_state)")
