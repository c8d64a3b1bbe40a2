"""The extension points and the op signatures, as typed Protocols.

Letters: B batch, L length, H model width, N state size, S any trailing state shape. Layout is
batch-first (B, L, H); a recurrent state is a ``dict[str, Tensor]``. The conformance suite
(``zoo_core.testing``) is what enforces these; ``runtime_checkable`` only checks that the methods
exist.

Four extension points: ``SSMCore``, ``Discretizer``, ``KernelBackend``, ``StackingPolicy``. Four op
signatures, what a backend registered for an op must implement (``register(name, op, target)``):
``KernelOp`` and ``ConvOp`` (LTI cores: kernel then convolution), ``ScanOp`` (a linear recurrence)
and ``SelectiveScanOp`` (Mamba's input-dependent scan, registered as op ``"scan"`` serving the
structure ``"selective"``). An implementation that serves several structures takes a keyword
``structure``; it is bound when the backend is resolved, so a core calls the op without it.
Every op has a ``naive`` reference with the same signature, which every other backend must equal
in outputs, final state and gradients (the conformance check ``backends``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

State = dict[str, Tensor]

# Capability names a core may declare.
CAPABILITIES = frozenset({
    "causal",           # y_t depends on x_{≤t} only (padded batches are exact; the suite checks it)
    "step",             # step() advances one token (requires "causal")
    "initial_state",    # forward(x, state) starts from a given state
    "lti",              # time-invariant: conv backends apply
    "complex_params",   # holds complex parameters (saved as real views)
    "continuous_time",  # has a step size Δ: the sampling rate can be rescaled
    "growing_state",    # the streaming state may grow with length (a KV cache); CoreParams.grows_state() says when
    "packing",          # forward_packed(x, segments) runs packed documents natively (zoo_core.packing)
})


class OptimHint(NamedTuple):
    """Per-parameter optimiser settings a core asks for (S4's ``_optim`` convention)."""

    lr: float | None = None
    weight_decay: float | None = None


@runtime_checkable
class SSMCore(Protocol):
    """A sequence mixer without norm or residual: (B, L, H) -> (B, L, H)."""

    capabilities: ClassVar[frozenset[str]]

    def forward(self, x: Tensor, state: State | None = None) -> Tensor: ...

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]: ...

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]: ...

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State: ...

    def optim_hints(self) -> Mapping[str, OptimHint]: ...


class PackedCore(Protocol):
    """What a core declaring ``packing`` adds (``zoo_core.packing``): x (B, L, H) holds the documents
    ``segments`` lays out; every document starts from the zero state. Returns (B, L, H) outputs (finite,
    unspecified on padding) and, with ``with_states``, each document's final state (batch N, row-major;
    None when they cannot be batched, e.g. KV caches of unequal lengths)."""

    def forward_packed(self, x: Tensor, segments: Any, *, with_states: bool = True) -> tuple[Tensor, State | None]: ...


class AttentionOp(Protocol):
    """``attention(q (B, Hq, Lq, D), k (B, Hk, Lk, D), v (B, Hk, Lk, D), mask=None, *, causal=False, scale)``
    -> (B, Hq, Lq, D): softmax(q kᵀ · scale + mask) v per head, query head h reading key/value head
    h // (Hq / Hk) (grouped-query heads). ``mask`` is boolean, broadcastable to (B, Hq, Lq, Lk), True where
    the query may read the key; ``causal`` (only with ``mask=None`` and Lq = Lk) is the mask j ≤ i."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, causal: bool = False,
                 scale: float) -> Tensor: ...


@runtime_checkable
class Discretizer(Protocol):
    """Continuous (A, B, Δ) -> discrete (Ā, B̄, log Ā or None) for a declared structure."""

    def __call__(self, A: Tensor, B: Tensor, dt: Tensor, *, structure: str = "diag") -> Any: ...


class BoundDiscretizer(Protocol):
    """A discretizer with its structure bound (``CoreBase.discretizer_for``): returns
    ``zoo_core.discretize.Discrete(a, b, log_a)``."""

    def __call__(self, A: Tensor, B: Tensor, dt: Tensor | float) -> Any: ...


@runtime_checkable
class KernelBackend(Protocol):
    """One implementation of one op ("kernel", "conv" or "scan"), as registered: ``load()`` returns
    a callable of the op's signature (``KernelOp``, ``ConvOp``, ``ScanOp`` or ``SelectiveScanOp``);
    see ``zoo_core.plugin_registry.BackendEntry``."""

    name: str
    op: str
    priority: int

    def supports(self, problem: Any) -> str | None: ...

    def load(self) -> Any: ...


@runtime_checkable
class StackingPolicy(Protocol):
    """Depth as data: how many distinct blocks, and which one runs at each depth position."""

    def num_blocks(self, depth: int) -> int: ...

    def schedule(self, depth: int) -> Sequence[int]: ...


# op signatures ---------------------------------------------------------------------------------
class KernelOp(Protocol):
    """Op ``kernel``: a discrete LTI system -> its length-L convolution kernel.

    Args:
        system: ``zoo_core.kernels.systems.DiagSystem(log_a (H, N), w (H, N))`` (K_l = Σ_n w_n a_n^l,
            real part taken when complex), ``DenseSystem`` or ``DPLRSystem`` (S4); which ones a
            backend serves is its ``supports(problem)`` (``problem.structure``).
        L: kernel length ≥ 1.

    Returns:
        K: (H, L) real.
    """

    def __call__(self, system: Any, L: int) -> Tensor: ...


class ConvOp(Protocol):
    """Op ``conv``: causal (never circular) convolution of each channel with its kernel.

    Args:
        u: (B, L, H) input. k: (H, L) kernel (k[:, 0] multiplies the current step).

    Returns:
        y: (B, L, H), y[:, t] = Σ_{s ≤ t} k[:, t − s] · u[:, s], in u's dtype.
    """

    def __call__(self, u: Tensor, k: Tensor) -> Tensor: ...


class ScanOp(Protocol):
    """Op ``scan``: the linear recurrence h_t = a_t ⊗ h_{t−1} + b_t, structure bound at resolution.

    Args:
        a: transitions broadcastable to (B, L, *S) ("diag": elementwise) or (B, L, *S, 2, 2)
            ("block2x2": a 2×2 matrix per state); a time-invariant a has size 1 along B and L.
        b: inputs (B, L, *S) or (B, L, *S, 2); real or complex.
        h0: initial state (B, *S[, 2]), or None for zero.
        reset: (B, L) bool, or None: True at each packed document's first step, where h_{t−1} is
            dropped (``zoo_core.packing``: ``segments.starts``); a time-invariant a stays unexpanded.

    Returns:
        h_all: (B, L, *S[, 2]) every state; h_last: (B, *S[, 2]) the final one.
    """

    def __call__(self, a: Tensor, b: Tensor, h0: Tensor | None = None, *,
                 reset: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


class SelectiveScanOp(Protocol):
    """Op ``scan`` for the structure ``"selective"`` (Mamba): input-dependent Δ, B, C.

    h_t = exp(Δ_t ⊗ A) ⊙ h_{t−1} + (Δ_t ⊙ u_t) ⊗ B_t,  y_t = h_t · C_t + D ⊙ u_t.

    Args:
        u: (Bt, L, Di) input. delta: (Bt, L, Di) step sizes Δ > 0. A: (Di, N).
        B, C: (Bt, L, N) input-dependent or (Di, N) time-invariant. D: (Di,) or None.
        h0: (Bt, Di, N) initial state, or None for zero.
        starts: (Bt, L) bool or None, packed documents (``zoo_core.packing``): the state restarts
            from zero at these steps (the transition exp(Δ_t ⊗ A) is multiplied by an exact 0 there;
            gradients across a start are zero).
        ends: (Bt, L) bool or None: return the states after these steps instead of the last one.

    Returns:
        y: (Bt, L, Di) in u's dtype; h_last: (Bt, Di, N) in the compute dtype (float32 or float64),
        or with ``ends`` (number of ends, Di, N), the states after those steps in row-major order
        (each packed document's final state).
    """

    def __call__(self, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                 D: Tensor | None = None, h0: Tensor | None = None, *,
                 starts: Tensor | None = None, ends: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


def complex_dtype(real: torch.dtype) -> torch.dtype:
    """The complex dtype of a real one: float64 -> complex128, otherwise complex64."""
    return torch.complex128 if real == torch.float64 else torch.complex64


def require_float(x: Tensor, who: str) -> None:
    """For a core that satisfies ``SSMCore`` without ``CoreBase`` and has no mixed-precision path:
    refuse half-precision input with a TypeError naming the dtype (instead of NaN or a dtype error from
    deep inside). ``CoreBase`` cores need neither this nor anything else: half-precision input and
    autocast run at their parameters' dtype (``zoo_core.precision``)."""
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"{who} computes in float32 or float64 and has no half-precision path; got {x.dtype} input: cast it "
            "with x.float(), or decorate the core's forward/step with zoo_core.precision.at_compute_precision"
        )


def require_state_keys(who: str, state: Mapping[str, Any], parts: Mapping[str, str], config: str = "") -> None:
    """Refuse a carried state lacking a part the core needs, naming the missing parts, what each
    part is, and how to make a state; instead of a KeyError deep in the forward, or a continuation
    that silently restarts what the missing part carried.

    Args:
        who: the core's name, for the message ("Mamba2").
        state: the carried state.
        parts: every part the core needs -> what it is (its shape), e.g. ``{"ssm": "(B, H, P, N)"}``.
        config: the settings that decide which parts are needed, when some are optional
            ("use_rope=True"); said in the message.
    """
    missing = sorted(set(parts) - set(state))
    if missing:
        named = [f"{k} {v}".rstrip() for k, v in parts.items()]
        needs = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
        setting = f" with {config}" if config else ""
        raise ValueError(f"{who} state lacks {missing}: this core{setting} needs {needs}; start from "
                         "core.init_state(batch) or a state this core returned")
