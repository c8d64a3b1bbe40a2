"""Pools: how the stack's per-step features become the model's output, in parallel and streamed.

Letters: B batch, L model steps, n model steps committed at once, H model width, O outputs.

A pool is chosen once, when the model is built (``make_pool``, from the spec's ``model.pool``), so
the model's forward and step paths call its methods instead of testing a name. Every pool sees
features after the final norm (``hn``) and the head as a callable:

* ``read(hn, lengths, head)``: the parallel readout of a whole sequence (B, L, H), honouring
  ``lengths`` (steps past a sample's length never reach the pool).
* ``init_state`` / ``commit`` / ``stream_read``: what streaming keeps. ``commit`` folds complete
  model steps into the running ``PoolState``; ``stream_read`` gives the output for the prefix seen
  so far, optionally with one uncommitted model step (``extra``: a step the prefix ends inside, see
  ``zoo_core.nn.reshape``) that is read but not kept.
* ``step_output``: the shape ``step`` returns (one step of a per-step output, or the pooled output).

Pools: ``mean`` (the head on the mean of the features over valid steps), ``last`` (the head on the
last valid step), ``mean_logits`` (the head on every step, then the mean of its outputs — the
LrcSSM backbone's readout; unlike ``mean`` when the head is nonlinear), ``none`` (per-step outputs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..errors import UsageError

Head = Callable[[Tensor], Tensor]


@dataclass
class PoolState:
    """A pooled task's running readout (the same fields for every pool, so states look alike).

    total: (B, W) sum of the pooled values over committed steps (W = H, or O for ``mean_logits``).
    count: (B,) long, committed model steps.
    last: (B, H) the last committed step's normalised features.
    """

    total: Tensor
    count: Tensor
    last: Tensor


def masked_mean(h: Tensor, lengths: Tensor | None) -> Tensor:
    """Mean over time of h (B, L, W), counting only each sample's first ``lengths`` steps (B, W)."""
    if lengths is None:
        return h.mean(dim=1)
    mask = (torch.arange(h.shape[1], device=h.device) < lengths.to(h.device)[:, None]).to(h.dtype)  # (B, L)
    return (h * mask[..., None]).sum(dim=1) / lengths.to(h.device, h.dtype)[:, None]


class Pool:
    """The per-step readout (``none``): the head on every step, nothing kept while streaming."""

    name: ClassVar[str] = "none"
    per_step: ClassVar[bool] = True

    def __str__(self) -> str:
        return self.name

    def read(self, hn: Tensor, lengths: Tensor | None, head: Head) -> Tensor:
        """Normalised features (B, L, H) → outputs (B, L, O); lengths do not change valid steps."""
        return head(hn)

    def init_state(self, batch_size: int, d_model: int, head: nn.Module, *, device: torch.device | str | None,
                   dtype: torch.dtype) -> PoolState | None:
        return None

    def commit(self, state: PoolState | None, hn: Tensor, head: Head) -> PoolState | None:
        return state

    def stream_read(self, state: PoolState | None, hn: Tensor | None, extra: Tensor | None, head: Head) -> Tensor:
        """The committed chunk's outputs (B, n, O); a per-step task has no incomplete steps."""
        if hn is None:
            raise UsageError("a per-step readout needs the steps just committed (input reshaping needs a pooled task)")
        return head(hn)

    def step_output(self, y: Tensor) -> Tensor:
        """(B, 1, O) of one step → (B, O)."""
        return y[:, 0]


class RunningPool(Pool):
    """A pooled readout: a running sum, count and last step are enough to stream it exactly."""

    per_step: ClassVar[bool] = False

    def width(self, d_model: int, head: nn.Module) -> int:
        """The width of what is summed over time (the features: H)."""
        return d_model

    def summand(self, hn: Tensor, head: Head) -> Tensor:
        """What is summed over time for each step (the normalised features)."""
        return hn

    def finish(self, mean: Tensor, last: Tensor, head: Head) -> Tensor:
        """The output from the running mean (B, W) and the last step (B, H)."""
        raise NotImplementedError

    def read(self, hn: Tensor, lengths: Tensor | None, head: Head) -> Tensor:
        return self.finish(masked_mean(self.summand(hn, head), lengths), hn, head)

    def init_state(self, batch_size: int, d_model: int, head: nn.Module, *, device: torch.device | str | None,
                   dtype: torch.dtype) -> PoolState:
        return PoolState(total=torch.zeros(batch_size, self.width(d_model, head), device=device, dtype=dtype),
                         count=torch.zeros(batch_size, device=device, dtype=torch.long),
                         last=torch.zeros(batch_size, d_model, device=device, dtype=dtype))

    def commit_documents(self, hn: Tensor, lengths: Tensor, head: Head) -> PoolState:
        """The running state after each of N documents, from zero: hn (N, L_max, H) left-aligned
        (``Segments.unpack``), ``lengths`` (N,) valid steps (the slots after them never count)."""
        mask = (torch.arange(hn.shape[1], device=hn.device) < lengths[:, None]).to(hn.dtype)[..., None]  # (N, L_max, 1)
        total = (self.summand(hn, head) * mask).sum(dim=1)
        return PoolState(total, lengths.long(), hn[torch.arange(hn.shape[0], device=hn.device), lengths - 1])

    def commit(self, state: PoolState | None, hn: Tensor, head: Head) -> PoolState:
        """Fold committed steps hn (B, n, H) into the running state."""
        state = _require(state, self)
        return PoolState(state.total + self.summand(hn, head).sum(dim=1), state.count + hn.shape[1], hn[:, -1])

    def stream_read(self, state: PoolState | None, hn: Tensor | None, extra: Tensor | None, head: Head) -> Tensor:
        """The output for the prefix: the running state, plus one uncommitted step ``extra`` (B, H)."""
        state = _require(state, self)
        total, count, last = state.total, state.count, state.last
        if extra is not None:
            total = total + self.summand(extra, head)
            count, last = count + 1, extra
        return self.finish(total / count.clamp(min=1).to(total.dtype)[:, None], last, head)

    def step_output(self, y: Tensor) -> Tensor:
        return y


class MeanPool(RunningPool):
    """The head on the mean of the features over valid steps."""

    name: ClassVar[str] = "mean"

    def finish(self, mean: Tensor, last: Tensor, head: Head) -> Tensor:
        return head(mean)


class LastPool(RunningPool):
    """The head on the last valid step."""

    name: ClassVar[str] = "last"

    def read(self, hn: Tensor, lengths: Tensor | None, head: Head) -> Tensor:
        last = hn[:, -1] if lengths is None else hn[torch.arange(hn.shape[0], device=hn.device), lengths.to(hn.device) - 1]
        return head(last)

    def finish(self, mean: Tensor, last: Tensor, head: Head) -> Tensor:
        return head(last)


class MeanLogitsPool(RunningPool):
    """The mean over valid steps of the head on every step (the LrcSSM backbone's readout)."""

    name: ClassVar[str] = "mean_logits"

    def width(self, d_model: int, head: nn.Module) -> int:
        return [m for m in head.modules() if isinstance(m, nn.Linear)][-1].out_features

    def summand(self, hn: Tensor, head: Head) -> Tensor:
        return head(hn)

    def finish(self, mean: Tensor, last: Tensor, head: Head) -> Tensor:
        return mean


POOLS: dict[str, type[Pool]] = {p.name: p for p in (MeanPool, LastPool, MeanLogitsPool, Pool)}


def make_pool(name: str) -> Pool:
    """The pool a spec's ``model.pool`` names."""
    if name not in POOLS:
        raise UsageError(f"unknown pool {name!r}; choose one of {tuple(POOLS)}")
    return POOLS[name]()


def _require(state: PoolState | None, pool: Pool) -> PoolState:
    if state is None:
        raise UsageError(f"the {pool.name!r} pool streams from a running pool state, and this state has none at the "
                         "depth read; start the stream with the model's init_state (or adaptive_init_state)")
    return state
