"""EMA: h_t = a ⊙ h_{t−1} + (1 − a) ⊙ x_t, y_t = h_t + d ⊙ x_t. Letters: B batch, L length, H width."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from zoo_core.corebase import CoreBase
from zoo_core.plugin_registry import Problem
from zoo_core.protocols import State, require_float

from .params import EMAParams


class EMA(CoreBase, params=EMAParams):
    paths = {"recurrent": ("scan",)}
    reference = {"scan": "naive"}
    problem = Problem(structure="diag", lti=True)

    def __init__(self, d_model: int, init_decay: float = 0.9, backend: str | Mapping[str, str] = "auto", *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.d_model = d_model
        logit = torch.logit(torch.tensor(init_decay, dtype=torch.float64)).item()
        self.decay_logit = nn.Parameter(torch.full((d_model,), logit, **kw))  # (H,)
        self.d = nn.Parameter(torch.zeros(d_model, **kw))  # (H,)

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        require_float(x, "EMA")
        a = torch.sigmoid(self.decay_logit)  # (H,)
        h, h_last = self.ops.scan(a[None, None], (1 - a) * x, None if state is None else state["h"])  # (B, L, H)
        return h + self.d * x, {"h": h_last}

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        require_float(x_t, "EMA")
        a = torch.sigmoid(self.decay_logit)
        h = a * state["h"] + (1 - a) * x_t  # (B, H)
        return h + self.d * x_t, {"h": h}

    def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State:
        return {"h": torch.zeros(batch_size, self.d_model, device=device or self.d.device, dtype=dtype or self.d.dtype)}
