"""LinOSS: P uncoupled forced harmonic oscillators, discretised into 2×2 blocks and scanned.

Letters: B batch, L length, H channels (d_model), P oscillators (d_state), R = 2 (real and
imaginary part), K = 2 (the [z, y] state of one oscillator).

    continuous   y'' = −A y + B u,   o = Re(C y) + D u         A = ReLU(A_diag) ≥ 0 (P,)
                 B ∈ C^(P×H), C ∈ C^(H×P), D ∈ R^H, Δ = sigmoid(steps)·dt_scale (P,)
    discrete     [z; y]_n = M [z; y]_{n−1} + F u_n               M (P, 2, 2) real, F (P, H, 2)
    output       o_n = Re(C y_n) + D u_n                         (position only, no factor 2)

M is real and B complex, so the real and imaginary parts of (z, y) evolve independently. The
sequence path uses that: it scans real tensors with the part as a state dimension, (B, L, R, P, K),
and never touches complex autograd. ``step`` runs the same maths in complex arithmetic, so the
conformance check "step vs forward" also checks the real form against the complex one.
M is never diagonalised: at A = 0 it is the Jordan block [[1, 0], [Δ, 1]].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.discretize import Discrete
from zoo_core.packing import Segments
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State, complex_dtype
from zoo_core.stream import BlockStream

from .discretize import UnstableDiscretizationError, check_dt2A
from .params import DT_MAX_DEFAULT, LinOSSParams


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


class LinOSS(CoreBase, params=LinOSSParams):
    real_stream = True  # step takes the state's real view too (zoo_core.stream): ONNX export
    ssm_params = ("A_diag", "steps")
    paths = {"recurrent": ("scan",)}
    reference = {"scan": "naive"}
    # The scan sees real tensors only (B's real and imaginary parts as a state dimension).
    problem = Problem(structure="block2x2", lti=True, complex=False)

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        discretizer: str = "linoss-im",
        A_min: float = 0.0,
        A_max: float = 1.0,
        dt_min: float = 0.5,
        dt_max: float = DT_MAX_DEFAULT,
        dt_scale: float = 1.0,
        ssm_lr: float | None = None,
        backend: str | Mapping[str, str] = "auto",
        *,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self._discretize = self.discretizer_for(discretizer)
        # Δ²A bound of the chosen scheme, or None when it is stable for every A ≥ 0 (IM).
        self.dt2A_max: float | None = getattr(self._discretize, "dt2A_max", None)
        self.discretizer = discretizer
        self.d_model, self.d_state, self.dt_scale, self.ssm_lr = d_model, d_state, float(dt_scale), ssm_lr
        H, P = d_model, d_state
        kw = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        lo, hi = _logit(dt_min), _logit(dt_max)
        self.A_diag = nn.Parameter(A_min + (A_max - A_min) * torch.rand(P, **kw))  # (P,)  A = ReLU(·)
        self.steps = nn.Parameter(lo + (hi - lo) * torch.rand(P, **kw))  # (P,)  Δ = σ(·)·dt_scale
        self.B = nn.Parameter((2 * torch.rand(P, H, 2, **kw) - 1) / math.sqrt(H))  # (P, H, R)
        self.C = nn.Parameter((2 * torch.rand(H, P, 2, **kw) - 1) / math.sqrt(P))  # (H, P, R)
        self.D = nn.Parameter(torch.randn(H, **kw))  # (H,)

    # parameters -> discrete system ------------------------------------------------------
    def stiffness(self) -> Tensor:
        return torch.relu(self.A_diag)  # (P,)

    def dt(self) -> Tensor:
        return torch.sigmoid(self.steps) * self.dt_scale  # (P,)

    def _discrete(self, B: Tensor) -> Discrete:
        return self._discretize(self.stiffness(), B, self.dt())

    def check_stability(self) -> float:
        """Return max Δ²A over the oscillators; raise ``UnstableDiscretizationError`` if the scheme's
        rule fails (IMEX: Δ²A ≤ 4 for every oscillator). IM is stable for every A ≥ 0: it only reports."""
        if self.dt2A_max is None:
            with torch.no_grad():
                return float((self.dt() ** 2 * self.stiffness()).max())
        return check_dt2A(self.stiffness(), self.dt(), self.dt2A_max, "LinOSS")

    def _guard(self) -> None:
        if self.dt2A_max is not None:  # IMEX: one max over P and one host sync per forward
            check_dt2A(self.stiffness(), self.dt(), self.dt2A_max, "LinOSS")

    # sequence --------------------------------------------------------------------------
    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        h0 = None
        if state is not None:
            h = state["h"]  # (B, P, K) complex
            h0 = torch.stack([h.real, h.imag], 1)  # (B, R, P, K)
        y, hs = self._sequence(x, h0, None)
        return y, {"h": self._complex_state(hs[:, -1])}  # h (B, P, K)

    def forward_packed(self, x: Tensor, segments: Segments, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """Packed documents (``zoo_core.packing``) in one scan: the 2×2 transition is zeroed at every
        document start (the scan's ``reset``), so each document starts from rest; each final state
        is its last step's."""
        segments.check(x)
        y, hs = self._sequence(x, None, segments.starts)
        return y, ({"h": self._complex_state(segments.at_ends(hs))} if with_states else None)

    def _sequence(self, x: Tensor, h0: Tensor | None, reset: Tensor | None) -> tuple[Tensor, Tensor]:
        """(outputs (B, L, H), every state (B, L, R, P, K) real) from h0 (B, R, P, K) or zero; with
        ``reset`` (B, L) the scan restarts at the marked steps (packed documents)."""
        self._guard()
        Bsz, L, H = x.shape
        P = self.d_state
        d = self._discrete(self.B)  # a (P, K, K), b (P, H, R, K) real
        W = d.b.permute(1, 2, 0, 3).reshape(H, 2 * P * 2)  # (H, R·P·K)
        f = (x.to(W.dtype) @ W).view(Bsz, L, 2, P, 2)  # (B, L, R, P, K)
        h0 = None if h0 is None else h0.to(W.dtype)
        if reset is None:
            hs, _ = self.ops.scan(d.a, f, h0)  # (B, L, R, P, K)
        else:
            hs, _ = self.ops.scan(d.a, f, h0, reset=reset)
        C = torch.stack([self.C[..., 0], -self.C[..., 1]])  # (R, H, P): Re(Cy) = C_re y_re − C_im y_im
        y = torch.einsum("blrp,rhp->blh", hs[..., 1], C) + self.D * x  # (B, L, H)
        return y.to(x.dtype), hs

    @staticmethod
    def _complex_state(h: Tensor) -> Tensor:
        """(…, R, P, K) real parts → (…, P, K) complex, the streaming state."""
        return torch.complex(h[..., 0, :, :], h[..., 1, :, :])

    # streaming -------------------------------------------------------------------------
    def stream(self) -> BlockStream:
        """The discretised oscillators in real arithmetic, cached while the parameters are unchanged."""
        def make() -> BlockStream:
            d = self._discrete(torch.view_as_complex(self.B))  # a (P, K, K) real, b (P, H, K) complex
            return BlockStream.of(d.a.to(d.b.real.dtype), d.b, torch.view_as_complex(self.C), self.D)
        return self.cached("stream", make)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One token; state {"h": (B, P, 2) complex, or its real view (B, P, 2, 2): the exported form}.
        Does not check the IMEX rule (see ``init_state``)."""
        h = state["h"]
        if h.is_complex() and h.dtype != complex_dtype(self.D.dtype):
            h = h.to(complex_dtype(self.D.dtype))
        y, h = self.stream().step_state(x_t, h)
        return y.to(x_t.dtype), {"h": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        """Zero (z, y) for every oscillator, (B, P, 2) complex; checks the IMEX rule once per stream."""
        self._guard()
        dtype = dtype or self.D.dtype
        dtype = dtype if dtype.is_complex else complex_dtype(dtype)
        return {"h": torch.zeros(batch_size, self.d_state, 2, dtype=dtype, device=device or self.D.device)}

    def rescale_dt(self, factor: float) -> None:
        """Multiply every Δ by ``factor`` (2.0: the input is sampled at half the rate).

        Refused, leaving the layer unchanged, if the new Δ breaks the scheme's rule (IMEX: Δ²A ≤ 4).
        """
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"dt rescaling factor must be a positive finite number, got {factor}")
        if self.dt2A_max is not None:
            try:
                check_dt2A(self.stiffness(), self.dt() * factor, self.dt2A_max, f"LinOSS rescaled by {factor:g}")
            except UnstableDiscretizationError as exc:
                raise UnstableDiscretizationError(f"{exc} (dt_scale left at {self.dt_scale:g})") from None
        self.dt_scale *= factor
        self.clear_cache()  # the cached discretised oscillators used the old Δ

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, discretizer={self.discretizer}, "
                f"backend={self.backend_choice.label()}")
