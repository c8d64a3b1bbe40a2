"""Stack: executes a depth schedule (from a stacking policy) in ``forward`` and ``step``.

Letters: B batch, L length, H model width. ``blocks`` holds the distinct blocks only, so weights
shared across depth exist (and are saved) once; ``schedule[i]`` is the block run at depth position
i. One recurrent state is kept per depth position, even when positions share a block.
A hybrid stack's blocks hold cores of different kinds (``core_names``: the spec's name of each
block's core); nothing below depends on it — each position's state is its own core's.
``advance`` carries those states over a chunk of model steps and hands back the features at the
depths the model reads (its streaming path, where adaptive depth reads several).

Depth recurrence (seed 001, DESIGN §7):

* **Positions past the training depth** (adaptive inference) repeat the schedule cyclically:
  position p runs block ``schedule[p mod depth]`` — for a periodic schedule that is
  ``schedule[p mod period]``, the seed's θ_ℓ = θ_((ℓ−1) mod m)+1 continued.
* **Damping** (Krasnosel'skii–Mann): position p computes ``h ← (1−α)·h + α·f(h)`` with α of the
  block it runs: a fixed float in (0, 1] (1 = the plain update), or learned — one parameter per
  unique block, α = sigmoid(logit), initialised at ``damping_init`` (default 0.9, close to the
  plain update, and a value the seed's Table 9 also tries fixed). The update is elementwise per
  time step, so it streams exactly.
* **Norms** when a block is reused: ``shared`` (default; the block's own norms serve every
  position it runs at, as the seed's code does by calling the same block module again) or
  ``per_position`` (each depth position has its own freshly initialised norms — separate
  statistics and affine parameters; the blocks then own no norms).
* **Dropout**: a block applied at several positions draws an independent mask at each one.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..packing import Segments
from ..protocols import State
from ..stacking_policies import schedule_period
from .blocks import Block, LrcBlock


class Stack(nn.Module):
    def __init__(
        self,
        blocks: Sequence[Block | LrcBlock],
        schedule: Sequence[int],
        *,
        damping: float | str = 1.0,
        damping_init: float = 0.9,
        norms: str = "shared",
        core_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if not schedule:
            raise ValueError("a stack needs at least one depth position")
        if sorted(set(schedule)) != list(range(len(blocks))):
            raise ValueError(f"schedule {list(schedule)} must use every one of the {len(blocks)} blocks")
        if core_names is not None and len(core_names) != len(blocks):
            raise ValueError(f"core_names names {len(core_names)} cores for {len(blocks)} blocks; give one name per block")
        self.blocks = nn.ModuleList(blocks)
        self.schedule = list(schedule)
        # the spec's name of each unique block's core ('core' = model.core; others: a hybrid's model.cores)
        self.core_names = list(core_names) if core_names is not None else ["core"] * len(blocks)
        self.period = schedule_period(self.schedule)
        self.damping_mode = "learned" if damping == "learned" else "fixed"
        if damping == "learned":
            if not 0 < damping_init < 1:
                raise ValueError(f"damping_init must lie in (0, 1), got {damping_init}")
            p = next(iter(self.blocks[0].parameters()), None)
            logit = math.log(damping_init / (1 - damping_init))
            self.damping_logit: nn.Parameter | None = nn.Parameter(torch.full((len(blocks),), logit, device=None if p is None else p.device,
                                                         dtype=torch.float32 if p is None or not p.is_floating_point() else p.dtype))
            self.alpha_fixed = 1.0
        else:
            alpha = float(damping)
            if not 0 < alpha <= 1:
                raise ValueError(f"damping α must lie in (0, 1] (1 = the plain update), got {alpha}")
            self.damping_logit = None
            self.alpha_fixed = alpha
        if norms not in ("shared", "per_position"):
            raise ValueError(f"norms must be 'shared' or 'per_position', got {norms!r}")
        self.norms_mode = norms
        self.position_norms: nn.ModuleList | None = None
        if norms == "per_position":
            self.position_norms = nn.ModuleList(
                nn.ModuleList(self.block(i).make_norms()) for i in self.schedule
            )
            for i in range(len(self.blocks)):
                self.block(i).drop_norms()

    @property
    def depth(self) -> int:
        return len(self.schedule)

    @property
    def hybrid(self) -> bool:
        """Whether the blocks hold cores of more than one name (a hybrid stack)."""
        return len(set(self.core_names)) > 1

    def core_name(self, pos: int) -> str:
        """The spec's name of the core run at depth position ``pos`` (0-based; past the depth: cyclic)."""
        return self.core_names[self.block_index(pos)]

    def block(self, i: int) -> Block | LrcBlock:
        """Unique block ``i``: ``self.blocks[i]``, typed."""
        return cast("Block | LrcBlock", self.blocks[i])  # ModuleList indexing is typed nn.Module; __init__ takes only these

    # one depth position -----------------------------------------------------------------
    def block_index(self, pos: int) -> int:
        """The unique block run at depth position ``pos`` (0-based; past the depth: cyclic)."""
        return self.schedule[pos % self.depth]

    def alpha(self, pos: int) -> Tensor | float:
        """The damping α at depth position ``pos``."""
        if self.damping_logit is None:
            return self.alpha_fixed
        return torch.sigmoid(self.damping_logit[self.block_index(pos)])

    def _norms(self, pos: int) -> list[nn.Module] | None:
        if self.position_norms is None:
            return None
        if pos >= self.depth:
            raise ValueError(
                f"depth position {pos + 1} is past the training depth {self.depth}, and with norms: per_position "
                "only the trained positions have norms; keep max_depth ≤ depth or use norms: shared"
            )
        return list(cast(nn.ModuleList, self.position_norms[pos]))  # __init__ fills it with one ModuleList per position

    def _damp(self, pos: int, h: Tensor, y: Tensor) -> Tensor:
        a = self.alpha(pos)
        if isinstance(a, float) and a == 1.0:
            return y
        return (1 - a) * h + a * y  # Krasnosel'skii–Mann

    def run_position(self, pos: int, h: Tensor, segments: Segments | None = None) -> Tensor:
        """Depth position ``pos`` on a whole sequence h (B, L, H), from a zero state; ``segments``: the
        documents of a packed batch (``zoo_core.packing``). (Not ``apply``: that is ``nn.Module.apply(fn)``,
        which ``model.apply(init_fn)`` must reach.)"""
        return self._damp(pos, h, self.block(self.block_index(pos))(h, norms=self._norms(pos), segments=segments))

    def apply_with_state(self, pos: int, h: Tensor, state: State | None,
                         segments: Segments | None = None) -> tuple[Tensor, State]:
        y, s = self.block(self.block_index(pos)).forward_with_state(h, state, norms=self._norms(pos), segments=segments)
        return self._damp(pos, h, y), s

    def apply_step(self, pos: int, h_t: Tensor, state: State) -> tuple[Tensor, State]:
        y, s = self.block(self.block_index(pos)).step(h_t, state, norms=self._norms(pos))  # (B, H)
        return self._damp(pos, h_t, y), s

    # whole stacks -----------------------------------------------------------------------
    def forward(self, x: Tensor, segments: Segments | None = None) -> Tensor:
        for pos in range(self.depth):
            x = self.run_position(pos, x, segments)  # (B, L, H)
        return x

    def iterate(self, x: Tensor, depth: int | None = None, segments: Segments | None = None) -> Iterator[tuple[int, Tensor]]:
        """Yield (number of positions applied, features (B, L, H)) after each position, 1..depth."""
        for pos in range(self.depth if depth is None else depth):
            x = self.run_position(pos, x, segments)
            yield pos + 1, x

    def forward_with_state(self, x: Tensor, states: Sequence[State] | None = None,
                           segments: Segments | None = None) -> tuple[Tensor, list[State]]:
        """Every position from its state (None: zero); with ``segments`` (packed documents, from zero)
        the states returned are each document's (batch N)."""
        out = []
        for pos in range(self.depth if states is None else len(states)):
            x, s = self.apply_with_state(pos, x, None if states is None else states[pos], segments)
            out.append(s)
        return x, out

    def step(self, x_t: Tensor, states: Sequence[State]) -> tuple[Tensor, list[State]]:
        """One time step through len(states) positions (the training depth unless states were
        made for more); returns the last position's output (B, H) and the new states."""
        outs, new = self.step_all(x_t, states)
        return outs[-1], new

    def step_all(self, x_t: Tensor, states: Sequence[State]) -> tuple[list[Tensor], list[State]]:
        """One time step; the output (B, H) after every position, and the new states."""
        outs, new = [], []
        for pos, state in enumerate(states):
            x_t, s = self.apply_step(pos, x_t, state)
            outs.append(x_t)
            new.append(s)
        return outs, new

    def advance(self, h: Tensor, states: Sequence[State], *, stepwise: bool,
                reads: Collection[int]) -> tuple[dict[int, Tensor], list[State]]:
        """Model steps h (B, n, H) through len(states) positions, each from its state.

        Returns the features (B, n, H) after each number of positions in ``reads`` (0: h itself)
        and the new states. ``stepwise`` runs the steps one at a time through ``step`` (n is small:
        a step, or the model steps one raw step completes); otherwise each position takes the chunk
        at once (``forward_with_state``)."""
        out = {0: h} if 0 in reads else {}
        new = []
        for pos, state in enumerate(states):
            if stepwise:
                ys = []
                for t in range(h.shape[1]):
                    y_t, state = self.apply_step(pos, h[:, t], state)
                    ys.append(y_t)
                h = torch.stack(ys, dim=1)
            else:
                h, state = self.apply_with_state(pos, h, state)
            new.append(state)
            if pos + 1 in reads:
                out[pos + 1] = h
        return out, new

    def init_state(self, batch_size: int, depth: int | None = None, **kw: Any) -> list[State]:
        """One state per depth position; ``depth`` > the training depth for adaptive streaming."""
        return [self.block(self.block_index(p)).init_state(batch_size, **kw) for p in range(depth or self.depth)]
