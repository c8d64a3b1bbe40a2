"""ModelState: what ``SequenceModel.step`` carries from one raw time step to the next.

Letters: B batch, c features per model step, H model width.

A typed, nested structure, so the model reads its parts by field instead of parsing string keys:

* ``t``: (B,) long, raw steps seen (the time channel's position);
* ``layers``: one core state per depth position (past the training depth for adaptive streaming);
* ``pools``: a running ``PoolState`` per depth whose output is read (pooled tasks only; adaptive
  streaming reads several depths);
* ``reshape``: the input reshaper's partly filled model step (models that reshape their input);
* ``adaptive``: the settings that shape an adaptive stream (``SequenceModel.adaptive_init_state``).

``flatten()`` / ``ModelState.unflatten()`` convert to and from a flat ``dict[str, Tensor]`` for
saving or exporting (e.g. with safetensors): keys ``input.t``, ``layer{pos}.{name}``,
``pool{depth}.{total,count,last}``, ``reshape.{buf,fill}``, ``adaptive.{max_depth,block_stops}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import UsageError
from ..protocols import State
from .pools import PoolState
from .reshape import ReshapeState

STOPS = ("period", "block")  # adaptive stop_at, in the order of the flattened ``block_stops`` flag


@dataclass(frozen=True)
class AdaptiveStream:
    """The adaptive settings fixed when a stream starts (they decide which depths keep a pool)."""

    max_depth: int
    stop_at: str


@dataclass
class ModelState:
    """A model's streaming state (see the module docstring)."""

    t: Tensor
    layers: list[State]
    pools: dict[int, PoolState] = field(default_factory=dict)
    reshape: ReshapeState | None = None
    adaptive: AdaptiveStream | None = None

    @property
    def depth(self) -> int:
        """How many depth positions keep a state."""
        return len(self.layers)

    def flatten(self) -> dict[str, Tensor]:
        """A flat name → tensor dict (see the module docstring for the names)."""
        flat = {"input.t": self.t}
        for pos, layer in enumerate(self.layers):
            flat.update({f"layer{pos}.{name}": value for name, value in layer.items()})
        for depth, pool in self.pools.items():
            flat.update(_fields(f"pool{depth}.", pool))
        if self.reshape is not None:
            flat.update(_fields("reshape.", self.reshape))
        if self.adaptive is not None:
            flat["adaptive.max_depth"] = torch.full_like(self.t, self.adaptive.max_depth)
            flat["adaptive.block_stops"] = torch.full_like(self.t, STOPS.index(self.adaptive.stop_at), dtype=torch.bool)
        return flat

    @classmethod
    def unflatten(cls, flat: dict[str, Tensor], *, depth: int | None = None) -> ModelState:
        """The state ``flatten`` wrote. ``depth``: how many depth positions it has, needed only when
        the deepest ones keep no tensors (names record only positions that keep some)."""
        groups: dict[str, dict[str, Tensor]] = {}
        for key, value in flat.items():
            group, _, name = key.partition(".")
            groups.setdefault(group, {})[name] = value
        try:
            t = groups.pop("input")["t"]
            layers = _numbered(groups, "layer")
            layers += [{} for _ in range((depth or 0) - len(layers))]
            pools = {depth: PoolState(**g) for depth, g in enumerate(_numbered(groups, "pool")) if g}
            reshape = ReshapeState(**groups.pop("reshape")) if "reshape" in groups else None
            adaptive = _adaptive(groups.pop("adaptive")) if "adaptive" in groups else None
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UsageError(f"not a flattened model state ({exc}); make one with ModelState.flatten()") from exc
        if groups:
            raise UsageError(f"not a flattened model state: unknown entries {sorted(groups)}")
        return cls(t, layers, pools, reshape, adaptive)


def _fields(prefix: str, obj: PoolState | ReshapeState) -> dict[str, Tensor]:
    return {prefix + f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _numbered(groups: dict[str, dict[str, Tensor]], stem: str) -> list[dict[str, Tensor]]:
    """Pop the groups ``{stem}0``, ``{stem}1``, … into a list indexed by their number (gaps empty)."""
    found = {int(g[len(stem):]): groups.pop(g) for g in list(groups) if g.startswith(stem) and g[len(stem):].isdigit()}
    return [found.get(i, {}) for i in range(1 + max(found, default=-1))]


def _adaptive(group: dict[str, Tensor]) -> AdaptiveStream:
    return AdaptiveStream(int(group["max_depth"][0]), STOPS[int(group["block_stops"][0])])
