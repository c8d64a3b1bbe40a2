"""The four extension points, as typed Protocols.

Letters: B batch, L length, H model width, N state size. Layout is batch-first (B, L, H);
a recurrent state is a ``dict[str, Tensor]``. The conformance suite (``zoo_core.testing``) is
what enforces these; ``runtime_checkable`` only checks that the methods exist.
"""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

State = dict[str, Tensor]

# Capability names a core may declare.
CAPABILITIES = frozenset({
    "step",             # step() advances one token
    "initial_state",    # forward(x, state) starts from a given state
    "lti",              # time-invariant: conv backends apply
    "complex_params",   # holds complex parameters (saved as real views)
    "continuous_time",  # has a step size Δ: the sampling rate can be rescaled
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


@runtime_checkable
class Discretizer(Protocol):
    """Continuous (A, B, Δ) -> discrete (Ā, B̄, log Ā or None) for a declared structure."""

    def __call__(self, A: Tensor, B: Tensor, dt: Tensor, *, structure: str = "diag") -> Any: ...


@runtime_checkable
class KernelBackend(Protocol):
    """One implementation of one op ("kernel", "conv" or "scan"); see ``zoo_core.registry.BackendEntry``."""

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


def complex_dtype(real: torch.dtype) -> torch.dtype:
    """The complex dtype of a real one: float64 -> complex128, otherwise complex64."""
    return torch.complex128 if real == torch.float64 else torch.complex64


def require_float(x: Tensor, who: str) -> None:
    """Refuse half-precision input to a core that computes in float32/float64 (instead of NaN)."""
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"{who} computes in float32 or float64 (its complex recurrences and FFTs have no "
            f"half-precision path); got {x.dtype} input: cast it with x.float(), or keep autocast "
            "away from SSM layers"
        )


class CoreBase(nn.Module):
    """Optional base class: ``forward`` and ``step`` from ``forward_with_state``, empty hints."""

    capabilities: ClassVar[frozenset[str]] = frozenset()
    # Parameters that get the learning rate ``self.ssm_lr`` and no weight decay (S4's convention).
    ssm_params: ClassVar[tuple[str, ...]] = ()

    def resolve_backend(self, setting: Any, *, who: str, device: Any = None) -> Any:
        """Resolve ``setting`` for this core's declared paths, on the device it is built for.

        Uses the class attributes ``paths``, ``prefer``, ``reference`` and ``problem``.
        """
        import dataclasses

        from .backends import resolve

        problem = dataclasses.replace(self.problem, device=torch.device(device or "cpu").type)  # type: ignore[attr-defined]
        return resolve(setting, paths=self.paths, prefer=self.prefer, reference=self.reference,  # type: ignore[attr-defined]
                       problem=problem, who=who)

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        return self.forward_with_state(x, state)[0]

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        raise NotImplementedError

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        y, new_state = self.forward_with_state(x_t[:, None, :], state)
        return y[:, 0], new_state

    def optim_hints(self) -> Mapping[str, OptimHint]:
        lr = getattr(self, "ssm_lr", None)
        if lr is None:
            return {}
        hint = OptimHint(lr=lr, weight_decay=0.0)
        return {name: hint for name in self.ssm_params}

    def rescale_dt(self, factor: float) -> None:
        """Multiply every step size Δ by ``factor`` (2.0: the input is sampled at half the rate).

        For continuous-time cores, which keep a ``dt_scale`` attribute that multiplies their Δ.
        """
        if "continuous_time" not in self.capabilities:
            raise ValueError(f"{type(self).__name__} is discrete-time: it has no step size Δ to rescale")
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"dt rescaling factor must be a positive finite number, got {factor}")
        self.dt_scale: float = self.dt_scale * factor
