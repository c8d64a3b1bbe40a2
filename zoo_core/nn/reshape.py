"""Input reshaping with a concentration factor c (seed 001 §3, DESIGN §7).

Letters: B batch, T raw steps, d raw features per step, c features per model step,
L = ceil(T·d / c) model steps.

Both of the seed's cases are one operation: flatten time × features into a stream of T·d values
(time-major, so a step's d values stay together) and cut it into c-wide model steps, zero-padding
the last one.

* ``concat`` (c > d, d | c): every model step is c/d consecutive raw steps side by side.
* ``rechunk`` (c < d): a raw step is spread over several model steps; c need not divide d (a model
  step may then straddle two raw steps), and the end is zero-padded (the seed pads rather than
  drops, A.4.2).

Padding. A sample with n valid raw steps (``lengths``) has ceil(n·d / c) valid model steps; its
values past n·d are zeroed before the cut, so the last valid model step is zero-padded exactly as
it would be for the sample alone, and model steps past it are masked out of pooling by the model.

Streaming. ``push`` takes raw steps and returns the complete model steps they finish plus the
incomplete remainder (zero-padded), keeping the remainder's values in the state: concat buffers
c/d raw steps per model step; rechunk splits one raw step into several model steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..spec import reshape_error


@dataclass
class ReshapeState:
    """What streaming keeps between raw steps: the values of the model step being filled.

    buf: (B, c) the buffered values, zero past ``fill``.
    fill: (B,) long, how many of the c values are buffered (the same for every sample).
    """

    buf: Tensor
    fill: Tensor


class InputReshaper:
    """Flatten-and-cut of (B, T, d) into (B, ceil(T·d/c), c), with lengths and a streaming twin."""

    def __init__(self, d: int, c: int) -> None:
        if d < 1 or c < 1:
            raise ValueError(f"reshape needs d ≥ 1 and c ≥ 1, got d={d}, c={c}")
        msg = reshape_error(d, c)
        if msg:
            raise ValueError(msg)
        self.d, self.c = d, c
        self.mode = "concat" if c > d else "rechunk" if c < d else "identity"

    def model_lengths(self, lengths: Tensor) -> Tensor:
        """Valid model steps ceil(n·d / c) for n valid raw steps (B,)."""
        return (lengths * self.d + self.c - 1) // self.c

    def __call__(self, x: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d) → (B, ceil(T·d/c), c) and the model-step lengths (B,) (None stays None)."""
        B, T, d = x.shape
        if d != self.d:
            raise ValueError(f"input has {d} features per step; the reshaper was built for {self.d}")
        flat = x.reshape(B, T * d)  # (B, T·d), time-major
        if lengths is not None:
            keep = torch.arange(T * d, device=x.device) < (lengths.to(x.device) * d)[:, None]  # (B, T·d)
            flat = flat * keep.to(flat.dtype)
        L = -(-T * d // self.c)
        flat = torch.nn.functional.pad(flat, (0, L * self.c - T * d))  # zero end padding
        out = flat.reshape(B, L, self.c)  # (B, L, c)
        return out, None if lengths is None else self.model_lengths(lengths)

    # streaming -------------------------------------------------------------------------
    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> ReshapeState:
        return ReshapeState(buf=torch.zeros(batch_size, self.c, device=device, dtype=dtype),
                            fill=torch.zeros(batch_size, device=device, dtype=torch.long))

    def push(self, x: Tensor, state: ReshapeState) -> tuple[Tensor, Tensor | None, ReshapeState]:
        """Raw steps x (B, T, d) after the buffered values.

        Returns the completed model steps (B, n, c) (n may be 0), the incomplete remainder
        zero-padded to (B, c) (None when nothing is left over) and the new state.
        """
        B, T, d = x.shape
        fill = int(state.fill[0]) if B else 0  # the same for every sample: they stream together
        values = torch.cat([state.buf[:, :fill], x.reshape(B, T * d)], dim=1)  # (B, fill + T·d)
        n = values.shape[1] // self.c
        full = values[:, : n * self.c].reshape(B, n, self.c)  # (B, n, c)
        rest = values[:, n * self.c :]  # (B, r), r < c
        buf = torch.nn.functional.pad(rest, (0, self.c - rest.shape[1]))  # (B, c)
        new = ReshapeState(buf=buf, fill=torch.full_like(state.fill, rest.shape[1]))
        return full, (buf if rest.shape[1] else None), new
