"""Bidirectional blocks for any causal core: the spec's ``block.bidirectional``.

Letters: B batch, L length, H model width.

``Bidirectional`` takes the block's causal core and runs it twice — forward in time, and on the
time-reversed sequence (reversed back afterwards) — then combines the two (Vision Mamba, Bi-Mamba,
Hydra's "two directions" baseline)::

    y_fwd = core_f(u)                      y_bwd = R(core_b(R(u)))
    sum:     y = y_fwd + y_bwd
    concat:  y = W [y_fwd; y_bwd] + b      (W: 2H → H)
    gate:    g = σ(W [y_fwd; y_bwd] + b),  y = g ⊙ y_fwd + (1 − g) ⊙ y_bwd

``core_b`` is a second core of the same kind and settings, built from the spec like the first with its
own parameters (``shared: false``), or ``core_f`` itself (``shared: true``). R reverses time *within each sequence's valid steps*
(``zoo_core.packing.Segments.reverse``): with right padding the reversed sequence still has its
padding at the end, so the causal core never lets padding reach a valid step, and padded batches give
exactly what each sequence gives alone; packed rows reverse each document in place.

It stands where the core stands (``block.core``), so every block layout, hybrid stacks, depth sharing,
save/load and the FLOP counter take it unchanged. It is not causal: it has no ``step`` and no carried
state, and a model holding it refuses to stream, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import NotCausalError
from ..packing import Segments, run_packed
from ..protocols import OptimHint, State

COMBINES = ("sum", "concat", "gate")


class Bidirectional(nn.Module):
    """A causal core in both directions (see the module docstring). Not causal itself."""

    capabilities: frozenset[str]

    def __init__(self, core: nn.Module, d_model: int, *, combine: str = "concat", shared: bool = False,
                 backward_core: nn.Module | None = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        name = type(core).__name__
        caps = frozenset(getattr(core, "capabilities", ()))
        if "causal" not in caps:
            raise ValueError(f"block.bidirectional wraps a causal core; {name} is not causal (it already reads both "
                             "directions): use its causal variant, or drop block.bidirectional")
        if combine not in COMBINES:
            raise ValueError(f"block.bidirectional.combine must be one of {COMBINES}, got {combine!r}")
        if shared != (backward_core is None):
            raise ValueError("give a backward core (a second core of the same kind and settings, its own parameters) "
                             "unless shared: true, which runs the one core both ways")
        self.forward_core = core
        self.backward_core = backward_core
        self.combine = combine
        self.shared = shared
        kw = {"device": device, "dtype": dtype}
        self.mix = nn.Linear(2 * d_model, d_model, **kw) if combine in ("concat", "gate") else None
        # the wrapped core's continuous-time Δ can still be rescaled (both directions); nothing streams
        self.capabilities = frozenset({"packing"} | (caps & {"continuous_time", "complex_params"}))

    # the two directions -------------------------------------------------------------------
    def _back(self) -> nn.Module:
        return self.forward_core if self.backward_core is None else self.backward_core

    def _run(self, core: nn.Module, u: Tensor, segments: Segments | None) -> Tensor:
        if segments is None or segments.padded_only:  # causal core: end padding never reaches valid steps
            return core(u)
        return run_packed(core, u, segments)[0]

    def _combine(self, y_f: Tensor, y_b: Tensor) -> Tensor:
        if self.mix is None:
            return y_f + y_b
        z = self.mix(torch.cat([y_f, y_b], dim=-1))
        if self.combine == "concat":
            return z
        g = torch.sigmoid(z)
        return g * y_f + (1 - g) * y_b

    def forward_packed(self, x: Tensor, segments: Segments | None, *, with_states: bool = True) -> tuple[Tensor, State | None]:
        """x (B, L, H) → (B, L, H); ``segments`` None means every row is one whole sequence."""
        rev = segments.reverse if segments is not None else (lambda t: t.flip(1))
        y_f = self._run(self.forward_core, x, segments)
        y_b = rev(self._run(self._back(), rev(x), segments))
        return self._combine(y_f, y_b), ({} if with_states else None)

    # the core protocol ------------------------------------------------------------------------
    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        return self.forward_with_state(x, state)[0]

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        if state:
            raise self._refuse("continue from a carried state")
        return self.forward_packed(x, None)[0], {}

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        raise self._refuse("step one token at a time")

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        raise self._refuse("stream (init_state)")

    def _refuse(self, what: str) -> NotCausalError:
        return NotCausalError(f"a bidirectional block ({type(self.forward_core).__name__} both ways) cannot {what}: its "
                              "reversed direction makes y_t depend on inputs after t; run whole sequences with forward(), "
                              "or drop block.bidirectional to stream")

    def optim_hints(self) -> Mapping[str, OptimHint]:
        """The wrapped cores' hints, their names prefixed by where each core sits."""
        out: dict[str, OptimHint] = {}
        for prefix, core in (("forward_core", self.forward_core), ("backward_core", self.backward_core)):
            hints = getattr(core, "optim_hints", None)
            if core is not None and callable(hints):
                out.update({f"{prefix}.{k}": v for k, v in hints().items()})
        return out

    def rescale_dt(self, factor: float) -> None:
        """Rescale Δ in both directions (a continuous-time core)."""
        for core in {id(c): c for c in (self.forward_core, self._back())}.values():
            core.rescale_dt(factor)  # type: ignore[operator]  # continuous-time cores define it (CoreBase)

    @property
    def dt_scale(self) -> float:
        return float(getattr(self.forward_core, "dt_scale", 1.0))

    @dt_scale.setter
    def dt_scale(self, value: float) -> None:  # rescale_sampling_rate's all-or-nothing restore
        for core in {id(c): c for c in (self.forward_core, self._back())}.values():
            setattr(core, "dt_scale", value)  # noqa: B010  a core's plain float attribute (nn.Module types setattr as tensors)

    @property
    def backend_choice(self) -> Any:
        return getattr(self.forward_core, "backend_choice", None)

    @property
    def hparams(self) -> Any:
        return getattr(self.forward_core, "hparams", None)

    def extra_repr(self) -> str:
        return f"combine={self.combine}, shared={self.shared}"
