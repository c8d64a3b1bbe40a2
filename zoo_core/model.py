"""SequenceModel: encoder → stack → final norm → pooling → head.

Letters: B batch, L length, H model width, D input channels, V vocabulary, O outputs.
Tasks: ``classification`` / ``regression`` pool over time then map to (B, O); ``sequence``
maps every step to (B, L, O); ``lm`` embeds tokens and returns (B, L, V) logits.
``step`` streams one time step with a constant-size state and returns what ``forward`` would
return for the prefix seen so far (for pooled tasks: the head on the running pool).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .protocols import State
from .stack import Stack

POOLS = ("mean", "last", "none")


class SequenceModel(nn.Module):
    def __init__(
        self,
        *,
        encoder: nn.Module,
        stack: Stack,
        head: nn.Module,
        task: str,
        pool: str,
        d_model: int,
        final_norm: nn.Module | None = None,
        time_length: int | None = None,
        spec: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; choose one of {POOLS}")
        self.encoder = encoder
        self.stack = stack
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.head = head
        self.task = task
        self.pool = pool
        self.d_model = d_model
        self.time_length = time_length
        self.spec: dict[str, Any] = spec or {}

    # input --------------------------------------------------------------------------
    def _encode(self, x: Tensor, start: Tensor | int = 0) -> Tensor:
        """Encoder input, with the time channel t_i = i / length prepended when configured."""
        if self.time_length is not None:
            steps = torch.arange(x.shape[1], device=x.device, dtype=x.dtype) + torch.as_tensor(start, device=x.device)[..., None].to(x.dtype)
            t = (steps / self.time_length).expand(x.shape[0], -1)[..., None]  # (B, L, 1)
            x = torch.cat([t, x], dim=-1)  # (B, L, 1 + D)
        return self.encoder(x)

    # parallel --------------------------------------------------------------------------
    def features(self, x: Tensor) -> Tensor:
        """Per-step features (B, L, H) after the stack and final norm."""
        return self.final_norm(self.stack(self._encode(x)))

    def forward(self, x: Tensor) -> Tensor:
        h = self.features(x)  # (B, L, H)
        if self.pool == "mean":
            h = h.mean(dim=1)  # (B, H)
        elif self.pool == "last":
            h = h[:, -1]  # (B, H)
        return self.head(h)

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """Run a chunk starting from ``state`` (None: from zero); returns the output and new state."""
        layer_states = None if state is None else self._layer_states(state)
        start = 0 if state is None else state["input.t"]
        h, new_layers = self.stack.forward_with_state(self._encode(x, start), layer_states)
        h = self.final_norm(h)  # (B, L, H)
        new_state = self._flatten(new_layers)
        new_state["input.t"] = torch.as_tensor(start, device=h.device).expand(h.shape[0]) + h.shape[1]
        if self.pool == "none":
            return self.head(h), new_state
        total = h.sum(dim=1) + (0 if state is None else state["pool.sum"])  # (B, H)
        count = h.shape[1] + (0 if state is None else state["pool.count"])  # (B,) or int
        new_state["pool.sum"] = total
        new_state["pool.count"] = torch.as_tensor(count, device=h.device).expand(h.shape[0]).clone()
        new_state["pool.last"] = h[:, -1]
        return self.head(self._pooled(new_state)), new_state

    # streaming -------------------------------------------------------------------------
    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        p = next(self.parameters())
        device = device or p.device
        dtype = dtype or (p.dtype if p.is_floating_point() else torch.float32)
        state = self._flatten(self.stack.init_state(batch_size, device=device, dtype=dtype))
        state["input.t"] = torch.zeros(batch_size, device=device, dtype=torch.long)
        if self.pool != "none":
            width = self.d_model
            state["pool.sum"] = torch.zeros(batch_size, width, device=device, dtype=dtype)
            state["pool.count"] = torch.zeros(batch_size, device=device, dtype=torch.long)
            state["pool.last"] = torch.zeros(batch_size, width, device=device, dtype=dtype)
        return state

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One time step: x_t is (B, D) features or (B,) tokens; returns (B, O) and the new state."""
        enc = self._encode(x_t[:, None], state["input.t"])[:, 0] if self.time_length is not None else self.encoder(x_t)
        h_t, layers = self.stack.step(enc, self._layer_states(state))
        h_t = self.final_norm(h_t)  # (B, H)
        new_state = self._flatten(layers)
        new_state["input.t"] = state["input.t"] + 1
        if self.pool == "none":
            return self.head(h_t), new_state
        new_state["pool.sum"] = state["pool.sum"] + h_t
        new_state["pool.count"] = state["pool.count"] + 1
        new_state["pool.last"] = h_t
        return self.head(self._pooled(new_state)), new_state

    def _pooled(self, state: State) -> Tensor:
        if self.pool == "last":
            return state["pool.last"]
        return state["pool.sum"] / state["pool.count"].clamp(min=1).to(state["pool.sum"].dtype)[:, None]

    @staticmethod
    def _flatten(layers: list[State]) -> State:
        return {f"layer{pos}.{k}": v for pos, s in enumerate(layers) for k, v in s.items()}

    def _layer_states(self, state: State) -> list[State]:
        out: list[State] = [{} for _ in range(self.stack.depth)]
        for key, value in state.items():
            if key.startswith("layer"):
                pos, _, name = key[5:].partition(".")
                out[int(pos)][name] = value
        return out

    # convenience -----------------------------------------------------------------------
    def save_pretrained(self, directory: str) -> Any:
        from .io.pretrained import save_pretrained

        return save_pretrained(self, directory)

    @classmethod
    def from_pretrained(cls, directory: str, **kw: Any) -> SequenceModel:
        from .io.pretrained import load_pretrained

        return load_pretrained(directory, **kw)

    def cores(self) -> list[nn.Module]:
        """The distinct cores, in block order."""
        return [b.core for b in self.stack.blocks]


def rescale_sampling_rate(model: SequenceModel, factor: float) -> SequenceModel:
    """Run the same weights on a sequence sampled ``factor`` times more coarsely: Δ ← Δ·factor.

    E.g. factor=2 for audio recorded at half the training sampling rate (S4's zero-shot
    Speech Commands trick). Only continuous-time cores (capability ``continuous_time``) can do
    this; the stored spec's ``model.core.dt_scale`` is updated so a saved model keeps it.
    """
    if not factor > 0:
        raise ValueError(f"the rescaling factor must be positive, got {factor}")
    cores = model.cores()
    bad = [type(c).__name__ for c in cores if "continuous_time" not in getattr(c, "capabilities", ())]
    if bad:
        raise ValueError(
            f"{', '.join(sorted(set(bad)))} is discrete-time (no step size Δ), so its sampling rate "
            "cannot be rescaled; only cores with the 'continuous_time' capability support this"
        )
    before = [core.dt_scale for core in cores]
    try:
        for core in cores:
            core.rescale_dt(factor)
    except Exception:
        for core, scale in zip(cores, before):  # all or nothing: no half-rescaled model
            core.dt_scale = scale
        raise
    core_spec = model.spec.get("model", {}).get("core")
    if core_spec is not None:
        core_spec["dt_scale"] = float(cores[0].dt_scale)
    return model
