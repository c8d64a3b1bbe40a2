"""Stacking policies: depth as data. A policy says how many distinct blocks to build and which
block runs at each depth position; ``Stack`` executes any schedule. Pure Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SpecError


@dataclass(frozen=True)
class Independent:
    """ABCDEF: one block per depth position."""

    def num_blocks(self, depth: int) -> int:
        return depth

    def schedule(self, depth: int) -> list[int]:
        return list(range(depth))


@dataclass(frozen=True)
class Periodic:
    """Period m: θ_ℓ = θ_((ℓ−1) mod m)+1, so depth 6 gives ABCABC (m=3), ABABAB (m=2), AAAAAA (m=1)."""

    period: int

    def _check(self, depth: int) -> None:
        if self.period < 1:
            raise SpecError(f"stacking period must be ≥ 1, got {self.period}")
        if depth % self.period:
            divisors = [d for d in range(1, depth + 1) if depth % d == 0]
            raise SpecError(
                f"stacking period {self.period} does not divide depth {depth}; "
                f"choose a period among {divisors} or change the depth"
            )

    def num_blocks(self, depth: int) -> int:
        self._check(depth)
        return self.period

    def schedule(self, depth: int) -> list[int]:
        self._check(depth)
        return [i % self.period for i in range(depth)]


def pattern(schedule: list[int]) -> str:
    """The letter pattern of a schedule: [0, 1, 0, 1] -> 'ABAB'."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return "".join(letters[i] if i < 26 else f"[{i}]" for i in schedule)


def schedule_period(schedule: list[int]) -> int:
    """The smallest m dividing len(schedule) with schedule[i] == schedule[i mod m]: the period a
    blockwise loss and adaptive inference step by (the depth itself for ABCDEF)."""
    depth = len(schedule)
    for m in range(1, depth + 1):
        if depth % m == 0 and all(schedule[i] == schedule[i % m] for i in range(depth)):
            return m
    return depth
