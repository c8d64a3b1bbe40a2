"""Stack: executes a depth schedule (from a stacking policy) in ``forward`` and ``step``.

``blocks`` holds the distinct blocks only, so weights shared across depth exist (and are saved)
once; ``schedule[i]`` is the block run at depth position i. One recurrent state is kept per depth
position, even when positions share a block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from .protocols import State


class Stack(nn.Module):
    def __init__(self, blocks: Sequence[nn.Module], schedule: Sequence[int]) -> None:
        super().__init__()
        if not schedule:
            raise ValueError("a stack needs at least one depth position")
        if sorted(set(schedule)) != list(range(len(blocks))):
            raise ValueError(f"schedule {list(schedule)} must use every one of the {len(blocks)} blocks")
        self.blocks = nn.ModuleList(blocks)
        self.schedule = list(schedule)

    @property
    def depth(self) -> int:
        return len(self.schedule)

    def forward(self, x: Tensor) -> Tensor:
        for i in self.schedule:
            x = self.blocks[i](x)  # (B, L, H)
        return x

    def forward_with_state(self, x: Tensor, states: Sequence[State] | None = None) -> tuple[Tensor, list[State]]:
        out = []
        for pos, i in enumerate(self.schedule):
            x, s = self.blocks[i].forward_with_state(x, None if states is None else states[pos])
            out.append(s)
        return x, out

    def step(self, x_t: Tensor, states: Sequence[State]) -> tuple[Tensor, list[State]]:
        out = []
        for pos, i in enumerate(self.schedule):
            x_t, s = self.blocks[i].step(x_t, states[pos])  # (B, H)
            out.append(s)
        return x_t, out

    def init_state(self, batch_size: int, **kw: Any) -> list[State]:
        return [self.blocks[i].init_state(batch_size, **kw) for i in self.schedule]
